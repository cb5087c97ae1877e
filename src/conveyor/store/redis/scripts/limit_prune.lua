-- name: limit_prune
-- ARGV: now, slack. Maintenance: forgets starts out of every window, ended
-- throttles, and queues left with no limit and no throttle.
local now_n = clock(ARGV[1])
for _, q in ipairs(redis.call('SMEMBERS', P .. 'limited')) do
    local l = limits_of(q)
    prune_starts(q, l, now_n, tonumber(ARGV[2]))
    local throttles = redis.call('HGETALL', qk('kthrottle', q))
    for i = 1, #throttles, 2 do
        if tonumber(throttles[i + 1]) <= now_n then redis.call('HDEL', qk('kthrottle', q), throttles[i]) end
    end
    if l.throttled_until and l.throttled_until <= now_n then
        redis.call('HDEL', qk('limit', q), 'throttled_until')
    end
    forget_if_empty(q, now_n)
end
return 1
