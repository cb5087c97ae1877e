-- name: signal_wait
-- ARGV: now, id, token, signal name, step name, until.
-- Under the attempt's lease: answers the step when it is recorded already; else
-- takes the oldest signal of that name not taken yet (signals:<id>) and records
-- it as the step in the job's steps hash; else
-- marks the wait (wait:<id>: step, signal, until; a wait of the same step marked
-- by an earlier attempt keeps its time), and once that time is over records the
-- step as timed out, else parks the job until then (a snooze: finish_all).
-- Returns {outcome, until, step entry or false, the jobs it could not read
-- (unreadable, common.lua)}, or nil when the lease is gone.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[1])
local id, token, name, step = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local j = load(id)
if not j or j.state ~= 'running' or j.lease_token ~= token then return nil end
local steps, wait = P .. 'steps:' .. id, P .. 'wait:' .. id

local function record(result)
    if redis.call('HEXISTS', steps, step) == 0 then
        redis.call('HSET', steps, step, cjson.encode({result, j.attempts, now_s, now_s}))
    end
    redis.call('DEL', wait)
    redis.call('SREM', P .. 'parked', id)
    return redis.call('HGET', steps, step)
end

-- The step recorded already (an earlier attempt's wait that ended): answered as a
-- replay would, and no signal taken, since nothing could record it.
local recorded = redis.call('HGET', steps, step)
if recorded then
    local entry = cjson.decode(recorded)
    local ok, result = pcall(cjson.decode, entry[1])
    local outcome = (ok and type(result) == 'table' and result.timeout) and 'timeout' or 'received'
    redis.call('DEL', wait)
    redis.call('SREM', P .. 'parked', id)
    return done({outcome, entry[4], recorded, unreadable})
end

local list = P .. 'signals:' .. id
local entries = redis.call('LRANGE', list, 0, -1)
for i, raw in ipairs(entries) do
    local s = cjson.decode(raw)
    if s[1] == name and not v(s[4]) then
        s[4], s[5] = now_s, step
        redis.call('LSET', list, i - 1, cjson.encode(s))
        return done({'received', now_s, record('{"payload": ' .. s[2] .. '}'), unreadable})
    end
end

local marked = redis.call('HMGET', wait, 'step', 'until')
local until_s = ARGV[6]
if marked[1] == step and marked[2] then until_s = marked[2] end
redis.call('HSET', wait, 'step', step, 'signal', name, 'until', until_s)
redis.call('HDEL', wait, 'children')
if tonumber(until_s) <= now_n then
    return done({'timeout', until_s, record(cjson.encode({timeout = until_s})), unreadable})
end
redis.call('SADD', P .. 'parked', id) -- counted while it waits (parked_counts)
finish_all({{id, token, 'snooze', false, false, until_s}}, now_n, now_s)
return done({'parked', until_s, false, unreadable})
