-- name: sleep_mark
-- ARGV: now (the moment the sleep is over from), id, token, step name, until.
-- Under the attempt's lease: marks that the job sleeps (ctx.sleep) until then,
-- a wait (wait:<id>) with neither signal nor children, listed in parked (the
-- jobs with a wait, counted by parked_counts). A mark of the same step keeps its
-- time: a replay after a crash sleeps on, and an operator's wake (wait_wake)
-- ends the sleep. Once that time is not after now, the wait ends. Returns the
-- time marked, or nil when the lease is gone.
local now_n = tonumber(ARGV[1])
local id, token, step = ARGV[2], ARGV[3], ARGV[4]
local f = redis.call('HMGET', jkey(id), 'state', 'lease_token')
if f[1] ~= 'running' or f[2] ~= token then return nil end
local wait = P .. 'wait:' .. id
local marked = redis.call('HMGET', wait, 'step', 'until')
local until_s = ARGV[5]
if marked[1] == step and marked[2] then until_s = marked[2] end
if tonumber(until_s) <= now_n then
    redis.call('DEL', wait)
    redis.call('SREM', P .. 'parked', id)
else
    redis.call('DEL', wait)
    redis.call('HSET', wait, 'step', step, 'until', until_s)
    redis.call('SADD', P .. 'parked', id)
end
return until_s
