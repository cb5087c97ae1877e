-- name: job_unhold
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending), hold_at. Held jobs get their run_at back
-- (due now if it has passed, or when it was not kept); their workers are woken.
local now_n, now_s = clock(ARGV[1])
local hold_n = tonumber(ARGV[3])
local changed = {}
for _, id in ipairs(cjson.decode(ARGV[2])) do
    local j = load(id)
    if j and j.state == 'queued' and tonumber(j.run_at) >= hold_n then
        local kept = redis.call('HGET', jkey(j.id), 'held_run_at')
        redis.call('HDEL', jkey(j.id), 'held_run_at')
        move(j, 'queued', 'run_at', kept or now_s)
        event(j, 'unheld', tonumber(j.attempts), now_s, nil)
        publish('jobs', j.queue)
        changed[#changed + 1] = tonumber(j.id)
    end
end
return done(changed)
