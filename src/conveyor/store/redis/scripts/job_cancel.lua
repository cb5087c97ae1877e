-- name: job_cancel
-- uses upkeep.lua
-- ARGV: now, ids (JSON, ascending).
-- Cancels queued jobs at once; flags running ones (cancel_requested: their
-- worker aborts the handler and records the cancel); leaves finished ones
-- alone. A queued parent parked waiting for its children (ctx.wait, wait:<id>)
-- brings its children to the cancel, and theirs in turn. Returns the ids changed.
local now_n, now_s = clock(ARGV[1])
local changed = {}
local todo, seen = cjson.decode(ARGV[2]), {}
local next_one = 1
while next_one <= #todo do
    local id = todo[next_one]
    next_one = next_one + 1
    local j = not seen[id] and load(id)
    seen[id] = true
    if j and j.state == 'queued' then
        local children = redis.call('HGET', P .. 'wait:' .. j.id, 'children')
        for _, child in ipairs(children and cjson.decode(children) or {}) do
            todo[#todo + 1] = child
        end
    end
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
