-- name: fair_set
-- ARGV: queue, weights (JSON; '' makes the queue not fair), default weight.
-- fair:<q> holds a fair queue's settings (its clock stays when they change);
-- fairqs the fair queues. A queue no longer fair forgets its turns (fturn:<q>).
local q = ARGV[1]
if ARGV[2] == '' then
    redis.call('DEL', qk('fair', q), qk('fturn', q))
    redis.call('SREM', P .. 'fairqs', q)
else
    redis.call('HSET', qk('fair', q), 'weights', ARGV[2], 'default', ARGV[3])
    redis.call('SADD', P .. 'fairqs', q)
end
return 1
