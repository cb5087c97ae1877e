-- name: worker_beat
-- ARGV: id, jobs_in_hand, now. Only a registered worker is marked seen; returns
-- what an operator asked of it (its control, JSON), false for nothing.
local key = P .. 'worker:' .. ARGV[1]
if redis.call('EXISTS', key) == 0 then return false end
redis.call('HSET', key, 'last_seen_at', ARGV[3], 'jobs_in_hand', ARGV[2])
redis.call('ZADD', P .. 'workers', ARGV[3], ARGV[1])
return redis.call('HGET', key, 'control')
