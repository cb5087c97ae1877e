-- name: job_cancel
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending).
-- Cancels queued jobs at once; flags running ones (cancel_requested: their
-- worker aborts the handler and records the cancel); leaves finished ones
-- alone. Returns the ids changed.
local now_n, now_s = clock(ARGV[1])
local changed = {}
for _, id in ipairs(cjson.decode(ARGV[2])) do
    local j = load(id)
    local kind = j and (j.state == 'queued' and 'cancelled'
        or (j.state == 'running' and j.cancel_requested ~= '1' and 'cancel_requested'))
    if kind == 'cancelled' then
        move(j, 'cancelled', 'finished_at', now_s)
        ended[#ended + 1] = j.id
        wake_group(j)
    elseif kind then
        j.cancel_requested = '1'
        save(j, {'cancel_requested'})
        publish('cancel', j.id)
    end
    if kind then
        event(j, kind, tonumber(j.attempts), now_s, nil)
        changed[#changed + 1] = tonumber(j.id)
    elseif j and j.state == 'waiting' then
        flow_cancel_waiting(j, now_s)
        changed[#changed + 1] = tonumber(j.id)
    end
end
flow_release(changed, now_s) -- jobs waiting for those cancelled (flows.lua)
return done(changed)
