-- name: leader_acquire
-- ARGV: name, holder, expires_at, now. Takes the lease when it is free or
-- expired, or renews it when it is ours. Returns 1 when held by :holder now.
local key = P .. 'leader:' .. ARGV[1]
local f = redis.call('HMGET', key, 'holder', 'expires_at')
if f[1] and f[1] ~= ARGV[2] and tonumber(f[2]) >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', key, 'holder', ARGV[2], 'expires_at', ARGV[3])
return 1
