-- name: worker_unregister
-- ARGV: id.
redis.call('DEL', P .. 'worker:' .. ARGV[1])
redis.call('ZREM', P .. 'workers', ARGV[1])
return 1
