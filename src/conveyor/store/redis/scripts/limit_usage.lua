-- name: limit_usage
-- ARGV: queue, now. What a limited queue's status shows (store/limiting.py's
-- limit_status): {running, starts in its rate window, ready jobs, limit keys
-- with no room, ready jobs held back by their key's room, keys throttled}, the
-- room being common.lua's, the claim's own rule.
local q, now = ARGV[1], clock(ARGV[2])
local l = limits_of(q) or {}
local started = l.rate and started_since(qk('starts', q), now - l.per) or 0
local keys_full, held, throttled = 0, 0, 0
for _, until_ in ipairs(redis.call('HVALS', qk('kthrottle', q))) do
    if tonumber(until_) > now then throttled = throttled + 1 end
end
for _, key in ipairs(redis.call('SMEMBERS', qk('kqkeys', q))) do
    local ready = 0 -- the key's queued jobs whose run_at has come
    for _, id in ipairs(redis.call('ZRANGE', kk('kq', q, key), 0, -1)) do
        local at = tonumber(redis.call('ZSCORE', qk('due', q), id))
        if at and at <= now then ready = ready + 1 end
    end
    if ready > 0 then
        local free = room(q, l, 'key_', key, 2147483647, now)
        if free <= 0 then keys_full = keys_full + 1 end
        held = held + math.max(ready - math.max(free, 0), 0)
    end
end
return {redis.call('ZCARD', state_key(q, 'running')), started,
        redis.call('ZCOUNT', qk('due', q), '-inf', fmt(now)), keys_full, held, throttled}
