-- name: children_park
-- ARGV: now, id, token, step name, children (JSON ids), until.
-- Under the attempt's lease: when every child waited for has ended, answers
-- 'ended' (the job waits no more); else marks the wait (wait:<id>: step, children,
-- until) and parks the job until then (a snooze: finish_all). Returns {that
-- answer, the jobs it could not read (unreadable, common.lua)}, or nil when the
-- lease is gone.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[1])
local id, token, step = ARGV[2], ARGV[3], ARGV[4]
local j = load(id)
if not j or j.state ~= 'running' or j.lease_token ~= token then return nil end
local live_children = 0
for _, child in ipairs(cjson.decode(ARGV[5])) do
    local state = redis.call('HGET', jkey(child), 'state')
    if state and live(state) then live_children = live_children + 1 end
end
local wait = P .. 'wait:' .. id
redis.call('DEL', wait)
if live_children == 0 then
    redis.call('SREM', P .. 'parked', id)
    return done({'ended', unreadable})
end
redis.call('SADD', P .. 'parked', id) -- counted while it waits (parked_counts)
redis.call('HSET', wait, 'step', step, 'children', ARGV[5], 'until', ARGV[6])
finish_all({{id, token, 'snooze', false, false, ARGV[6]}}, now_n, now_s)
return done({'parked', unreadable})
