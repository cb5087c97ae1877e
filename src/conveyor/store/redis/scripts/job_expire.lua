-- name: job_expire
-- uses upkeep.lua
-- ARGV: now ('' = Redis's clock), limit, error.
-- Ends up to :limit queued jobs whose deadline (expires=) is at or before now,
-- oldest deadline first, from the "expiring" index (the queued jobs that have a
-- deadline: enter and leave in common.lua keep it): cancelled with the
-- expiry's error, each with its event; the jobs waiting for them resolved
-- (flows.lua); each is counted in expired:<q>. Returns the ids ended.
local now_n, now_s = clock(ARGV[1])
local changed = {}
local due = redis.call('ZRANGEBYSCORE', P .. 'expiring', '-inf', now_s, 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
    local j = load(id)
    if j and j.state == 'queued' then
        move(j, 'cancelled', 'finished_at', now_s, 'error', ARGV[3])
        -- Counted while it stays so (leave in common.lua takes it out).
        zadd(qk('expired', j.queue), j.id, j.id)
        ended[#ended + 1] = j.id
        wake_group(j)
        event(j, 'cancelled', tonumber(j.attempts), now_s, ARGV[3])
        changed[#changed + 1] = tonumber(j.id)
    else -- gone, or no longer queued: an entry left behind
        zrem(P .. 'expiring', id)
    end
end
flow_release(changed, now_s) -- jobs waiting for those ended (flows.lua)
return done(changed)
