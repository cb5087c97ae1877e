-- name: limit_set
-- ARGV: queue, scope ('queue' or 'key'), rate, per, concurrency ('' = none), now,
-- keep (the parts of the scope left as they are: '', 'rate', 'concurrency' or
-- 'rate,concurrency'). Sets the limit of one scope of a queue; the other
-- scope's, the kept parts and any throttle stay. Returns the queue's limits
-- hash as it is now (empty: none).
local q, prefix, now_n = ARGV[1], ARGV[2] == 'key' and 'key_' or '', clock(ARGV[6])
redis.call('SADD', P .. 'limited', q)
local keep = {}
for part in string.gmatch(ARGV[7] or '', '[^,]+') do keep[part] = true end
keep.per = keep.rate -- a rate is its count and its window
for name, value in pairs({rate = ARGV[3], per = ARGV[4], concurrency = ARGV[5]}) do
    if keep[name] then -- left as it is
    elseif value == '' then
        redis.call('HDEL', qk('limit', q), prefix .. name)
    else
        redis.call('HSET', qk('limit', q), prefix .. name, value)
    end
end
forget_if_empty(q, now_n)
publish('jobs', q)
if redis.call('SISMEMBER', P .. 'limited', q) == 0 then return false end
return redis.call('HGETALL', qk('limit', q))
