-- name: limit_throttled_keys
-- ARGV: now. Keys throttled now, of every limited queue, as a flat list
-- {queue, key, until, ...} (sorted by the caller). A key throttle gives its
-- queue a place in ``limited``, so the walk starts there.
local now = clock(ARGV[1])
local found = {}
for _, q in ipairs(redis.call('SMEMBERS', P .. 'limited')) do
    local raw = redis.call('HGETALL', qk('kthrottle', q))
    for i = 1, #raw, 2 do
        if tonumber(raw[i + 1]) > now then
            found[#found + 1] = q
            found[#found + 1] = raw[i]
            found[#found + 1] = raw[i + 1]
        end
    end
end
return found
