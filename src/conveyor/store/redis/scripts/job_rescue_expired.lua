-- name: job_rescue_expired
-- uses upkeep.lua
-- ARGV: now ('' = Redis's clock), limit, error, keys to sweep.
-- Running jobs whose lease ran out, ended as job_finish's "rescue" in the same
-- script that read their leases: a compare-and-set that a worker renewing or
-- finishing at the same instant either wins or loses entirely. A lease whose
-- job cannot be read is dropped (see upkeep.lua). Returns the ids rescued.
local now_n, now_s = clock(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', '(' .. now_s, 'LIMIT', 0,
                       tonumber(ARGV[2]))
local items = {}
for _, id in ipairs(ids) do
    local token = redis.call('HGET', jkey(id), 'lease_token')
    if token then
        items[#items + 1] = {id, token, 'rescue', NULL, ARGV[3], NULL}
    else
        drop(id, {state = 'running'})
    end
end
local rescued = finish_all(items, now_n, now_s)
flow_release(rescued, now_s) -- jobs waiting for those that ended (flows.lua)
return done(rescued)
