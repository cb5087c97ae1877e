-- name: fair_status
-- ARGV: queue ('' = every fair queue).
-- Each fair queue as {queue, weights JSON, default, aging ({every, step, cap} or
-- {}), turns (HGETALL of fturn:<q>),
-- queued counts {key, count, ...}}: a key's count is its line kq:<q>:<key> less
-- the jobs there with a fair key of their own (fqoff:<q>), plus its line
-- fq:<q>:<key>; the shared key's ('') is the queue's queued jobs less those.
local asked = ARGV[1] ~= '' and {ARGV[1]} or redis.call('SMEMBERS', P .. 'fairqs')
local out = {}
for _, q in ipairs(asked) do
    local s = redis.call('HMGET', qk('fair', q), 'weights', 'default', 'aging_every',
                         'aging_step', 'aging_cap')
    if s[1] then
        local counts, keyed, by_key = {}, 0, {}
        for _, key in ipairs(redis.call('SMEMBERS', qk('kqkeys', q))) do
            by_key[key] = redis.call('ZCARD', kk('kq', q, key))
                          - (tonumber(redis.call('HGET', qk('fqoff', q), key)) or 0)
        end
        for _, key in ipairs(redis.call('SMEMBERS', qk('fqkeys', q))) do
            by_key[key] = (by_key[key] or 0) + redis.call('ZCARD', kk('fq', q, key))
        end
        for key, n in pairs(by_key) do
            if n > 0 then
                keyed = keyed + n
                counts[#counts + 1] = key
                counts[#counts + 1] = n
            end
        end
        counts[#counts + 1] = ''
        counts[#counts + 1] = redis.call('ZCARD', state_key(q, 'queued')) - keyed
        local aging = s[3] and {s[3], s[4], s[5]} or {}
        out[#out + 1] = {q, s[1], s[2], aging, redis.call('HGETALL', qk('fturn', q)), counts}
    end
end
return out
