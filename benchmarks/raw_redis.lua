-- The raw Redis loop the Redis store is measured against: the least a queue can
-- do with a job hash that carries what a job needs (task, payload, state,
-- times), one list of ready ids and one sorted set of leases, and nothing
-- else: no events, no priorities, no keys, groups or limits. KEYS[1] is its
-- key prefix.

-- name: claim
-- ARGV: how many, when the lease expires, now.
local ids = redis.call('LPOP', KEYS[1] .. 'ready', ARGV[1])
if not ids then return {} end
for _, id in ipairs(ids) do
    redis.call('HSET', KEYS[1] .. 'job:' .. id, 'state', 'running', 'started_at', ARGV[3])
    redis.call('ZADD', KEYS[1] .. 'leases', ARGV[2], id)
end
return ids

-- name: complete
-- ARGV: now, then the ids.
for i = 2, #ARGV do
    redis.call('HSET', KEYS[1] .. 'job:' .. ARGV[i], 'state', 'succeeded', 'finished_at', ARGV[1])
    redis.call('ZREM', KEYS[1] .. 'leases', ARGV[i])
end
return #ARGV - 1
