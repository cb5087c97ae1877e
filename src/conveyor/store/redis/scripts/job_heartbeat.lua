-- name: job_heartbeat
-- ARGV: leases (JSON [[id, token], ...]), lease seconds, now ('' = Redis's clock).
-- Extends the leases that still hold; returns {id, cancel_requested} for each.
local now_n = clock(ARGV[3])
local expires = fmt(now_n + tonumber(ARGV[2]))
local out = {}
for _, lease in ipairs(cjson.decode(ARGV[1])) do
    local f = redis.call('HMGET', jkey(lease[1]), 'state', 'lease_token', 'cancel_requested', 'queue')
    if f[1] == 'running' and f[2] == lease[2] and f[4] then -- (no queue: a hash to drop)
        redis.call('HSET', jkey(lease[1]), 'lease_expires_at', expires)
        redis.call('ZADD', state_key(f[4], 'running'), expires, lease[1])
        out[#out + 1] = {tonumber(lease[1]), f[3] == '1' and 1 or 0}
    end
end
return out
