-- name: job_hold
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending), hold_at. Queued jobs not held yet are parked
-- due at hold_at (later than any job may be due: no claim takes them), the
-- run_at they had kept in held_run_at; running and finished jobs are left alone.
local now_n, now_s = clock(ARGV[1])
local hold_n = tonumber(ARGV[3])
local changed = {}
for _, id in ipairs(cjson.decode(ARGV[2])) do
    local j = load(id)
    if j and j.state == 'queued' and tonumber(j.run_at) < hold_n then
        redis.call('HSET', jkey(j.id), 'held_run_at', j.run_at)
        move(j, 'queued', 'run_at', ARGV[3])
        event(j, 'held', tonumber(j.attempts), now_s, nil)
        changed[#changed + 1] = tonumber(j.id)
    end
end
return done(changed)
