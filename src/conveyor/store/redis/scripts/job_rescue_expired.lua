-- name: job_rescue_expired
-- uses upkeep.lua
-- ARGV: now ('' = Redis's clock), limit, error.
-- Running jobs whose lease ran out (the expired range of each queue's running
-- set), ended as job_finish's "rescue" in the same script that read their
-- leases: a compare-and-set that a worker renewing or finishing at the same
-- instant either wins or loses entirely. A lease whose job cannot be read is
-- dropped (see upkeep.lua). Returns the ids rescued.
local now_n, now_s = clock(ARGV[1])
local items, left = {}, tonumber(ARGV[2])
for _, q in ipairs(redis.call('HKEYS', P .. 'queues')) do
    if left <= 0 then break end
    local ids = redis.call('ZRANGEBYSCORE', state_key(q, 'running'), '-inf', '(' .. now_s, 'LIMIT', 0, left)
    left = left - #ids
    for _, id in ipairs(ids) do
        local token = redis.call('HGET', jkey(id), 'lease_token')
        if token then
            items[#items + 1] = {id, token, 'rescue', NULL, ARGV[3], NULL}
        else
            drop(id, {queue = q, state = 'running'})
        end
    end
end
local rescued = finish_all(items, now_n, now_s)
flow_release(rescued, now_s) -- jobs waiting for those that ended (flows.lua)
return done(rescued)
