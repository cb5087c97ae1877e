-- name: worker_register
-- ARGV: id, info (JSON without the times), now. Registers a worker, or, when it
-- is registered already, only marks it seen.
local key = P .. 'worker:' .. ARGV[1]
if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'info', ARGV[2], 'jobs_in_hand', '0', 'started_at', ARGV[3])
end
redis.call('HSET', key, 'last_seen_at', ARGV[3])
redis.call('ZADD', P .. 'workers', ARGV[3], ARGV[1])
return 1
