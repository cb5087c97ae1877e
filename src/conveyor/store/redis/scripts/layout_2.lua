-- name: layout_2
-- From layout 1: a queue's running set is scored by lease expiry, the leases set
-- goes. Events keep their first form (store.py reads both).
for _, q in ipairs(redis.call('HKEYS', P .. 'queues')) do
    for _, id in ipairs(redis.call('ZRANGE', state_key(q, 'running'), 0, -1)) do
        local expires = redis.call('HGET', jkey(id), 'lease_expires_at')
        if expires then redis.call('ZADD', state_key(q, 'running'), expires, id) end
    end
end
redis.call('DEL', P .. 'leases')
return 1
