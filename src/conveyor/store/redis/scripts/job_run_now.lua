-- name: job_run_now
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending). Queued jobs due later become due now.
local now_n, now_s = clock(ARGV[1])
local changed = {}
for _, id in ipairs(cjson.decode(ARGV[2])) do
    local j = load(id)
    if j and j.state == 'queued' and tonumber(j.run_at) > now_n then
        move(j, 'queued', 'run_at', now_s)
        event(j, 'run_now', tonumber(j.attempts), now_s, nil)
        publish('jobs', j.queue)
        changed[#changed + 1] = tonumber(j.id)
    end
end
return done(changed)
