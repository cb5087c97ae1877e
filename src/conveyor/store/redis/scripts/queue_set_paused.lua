-- name: queue_set_paused
-- ARGV: queue, paused ('1' or '0'). A resume wakes the queue's workers.
if ARGV[2] == '1' then
    redis.call('SADD', P .. 'paused', ARGV[1])
else
    redis.call('SREM', P .. 'paused', ARGV[1])
    publish('jobs', ARGV[1])
end
return 1
