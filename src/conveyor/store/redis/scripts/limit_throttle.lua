-- name: limit_throttle
-- ARGV: queue, limit key ('' = the whole queue), seconds, now ('' = Redis's clock).
-- Holds the queue (or one key) back until now + seconds; a throttle is
-- extended, never shortened, by another; 0 seconds lifts it. Returns its end.
local q, key = ARGV[1], ARGV[2]
local now_n, now_s = clock(ARGV[4])
local until_ = now_n + tonumber(ARGV[3])
-- A queue's throttle is a field of its limits; a key's, a field of kthrottle:<q>.
local hash, field = qk('limit', q), 'throttled_until'
if key ~= '' then hash, field = qk('kthrottle', q), key end
if until_ <= now_n then
    redis.call('HDEL', hash, field)
    forget_if_empty(q, now_n)
    publish('jobs', q)
    return now_s
end
local old = redis.call('HGET', hash, field)
local until_s = (old and tonumber(old) >= until_) and old or fmt(until_)
redis.call('HSET', hash, field, until_s)
redis.call('SADD', P .. 'limited', q)
return until_s
