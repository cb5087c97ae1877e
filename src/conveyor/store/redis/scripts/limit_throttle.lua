-- name: limit_throttle
-- ARGV: queue, limit key ('' = the whole queue), seconds, now ('' = Redis's clock).
-- Holds the queue (or one key) back until now + seconds; a throttle is
-- extended, never shortened, by another; 0 seconds lifts it. Returns its end.
local q, key = ARGV[1], ARGV[2]
local now_n, now_s = clock(ARGV[4])
local seconds = tonumber(ARGV[3])
if seconds <= 0 then
    if key == '' then
        redis.call('HDEL', qk('limit', q), 'throttled_until')
    else
        redis.call('HDEL', qk('kthrottle', q), key)
    end
    forget_if_empty(q, now_n)
    publish('jobs', q)
    return now_s
end
local until_ = now_n + seconds
local field_key, field = qk('limit', q), 'throttled_until'
if key ~= '' then field_key, field = qk('kthrottle', q), key end
local old = tonumber(redis.call('HGET', field_key, field))
local until_s = fmt(until_)
if old and old >= until_ then until_s = redis.call('HGET', field_key, field) end
redis.call('HSET', field_key, field, until_s)
redis.call('SADD', P .. 'limited', q)
return until_s
