-- name: next_run_in
-- ARGV: queues (JSON), now ('' = Redis's clock), group ('' = any).
-- The next moment a claim on :queues could start a job that it cannot now
-- (the SQL stores' next_run_at): the next queued job's run_at; for a queue
-- with limits, a throttle's end, the moment a full rate window lets the next
-- job through, or now when a claim would take a job already. Returns
-- {{now, moment} as strings, or {now} when there is none, the jobs its look at
-- the candidates could not read (unreadable)}.
local now_n, now_s = clock(ARGV[2])
local group = ARGV[3] ~= '' and ARGV[3] or nil
local best = nil
local function consider(at)
    if at and (best == nil or at < best) then best = at end
end
local function nth_newest(key, n, since)
    local row = redis.call('ZREVRANGEBYSCORE', key, '+inf', '(' .. fmt(since), 'WITHSCORES',
                           'LIMIT', n - 1, 1)
    return tonumber(row[2])
end
for _, q in ipairs(cjson.decode(ARGV[1])) do
    if redis.call('SISMEMBER', P .. 'paused', q) == 0 then
        local row = redis.call('ZRANGEBYSCORE', qk('due', q), '(' .. now_s, '+inf', 'WITHSCORES',
                               'LIMIT', 0, 1)
        consider(tonumber(row[2]))
        local l = limits_of(q)
        if l then
            if #candidates({q}, 1, now_n, group) > 0 then consider(now_n) end
            if l.throttled_until and l.throttled_until > now_n then
                consider(l.throttled_until)
            else
                for _, until_ in ipairs(redis.call('HVALS', qk('kthrottle', q))) do
                    if tonumber(until_) > now_n then consider(tonumber(until_)) end
                end
                if l.rate and started_since(qk('starts', q), now_n - l.per) >= l.rate then
                    consider(nth_newest(qk('starts', q), l.rate, now_n - l.per) + l.per)
                end
                if l.key_rate then
                    for _, key in ipairs(redis.call('SMEMBERS', qk('kstartkeys', q))) do
                        local skey = kk('kstarts', q, key)
                        if started_since(skey, now_n - l.key_per) >= l.key_rate then
                            consider(nth_newest(skey, l.key_rate, now_n - l.key_per) + l.key_per)
                        end
                    end
                end
            end
        end
    end
end
local answer = {now_s}
if best ~= nil then answer[2] = fmt(best) end
return done({answer, unreadable})
