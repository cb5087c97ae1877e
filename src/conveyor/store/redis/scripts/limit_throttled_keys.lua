-- name: limit_throttled_keys
-- ARGV: now, queue ('' = every queue). Keys throttled now, as a flat list
-- {queue, key, until, ...} (sorted by the caller). A key throttle gives its
-- queue a place in ``limited``, so the walk starts there.
local now = clock(ARGV[1])
local queues = ARGV[2] ~= '' and {ARGV[2]} or redis.call('SMEMBERS', P .. 'limited')
local found = {}
for _, q in ipairs(queues) do
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
