-- name: worker_prune
-- ARGV: last_seen_before. Forgets workers not seen since then.
local ids = redis.call('ZRANGEBYSCORE', P .. 'workers', '-inf', '(' .. ARGV[1])
for _, id in ipairs(ids) do
    redis.call('DEL', P .. 'worker:' .. id)
    redis.call('ZREM', P .. 'workers', id)
end
return #ids
