-- name: fair_set
-- ARGV: queue, weights (JSON; '' makes the queue not fair), default weight, and
-- aging: every (seconds; '' for none), step, cap.
-- fair:<q> holds a fair queue's settings (its clock stays when they change);
-- fairqs the fair queues. A queue no longer fair forgets its turns (fturn:<q>).
local q = ARGV[1]
if ARGV[2] == '' then
    redis.call('DEL', qk('fair', q), qk('fturn', q))
    redis.call('SREM', P .. 'fairqs', q)
else
    redis.call('HSET', qk('fair', q), 'weights', ARGV[2], 'default', ARGV[3])
    if ARGV[4] == '' then
        redis.call('HDEL', qk('fair', q), 'aging_every', 'aging_step', 'aging_cap')
    else
        redis.call('HSET', qk('fair', q), 'aging_every', ARGV[4], 'aging_step', ARGV[5],
                   'aging_cap', ARGV[6])
    end
    redis.call('SADD', P .. 'fairqs', q)
end
return 1
