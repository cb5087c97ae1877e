-- name: job_claim
-- ARGV: queues (JSON), limit, worker, token, lease seconds, now ('' = Redis's
-- clock), group ('' = any), slack seconds.
-- Moves up to :limit ready jobs to running under a fresh lease token (see
-- candidates in common.lua for what is ready); a limited queue records its
-- starts for the rates. Returns {the jobs, in claim order, the jobs it could not
-- read (unreadable)}.
local now_n, now_s = clock(ARGV[6])
local group = ARGV[7] ~= '' and ARGV[7] or nil
local chosen = candidates(cjson.decode(ARGV[1]), tonumber(ARGV[2]), now_n, group)
local expires = fmt(now_n + tonumber(ARGV[5]))
local out, claimed, limited = {}, {}, {}
for _, c in ipairs(chosen) do
    local j = c[4]
    leave(j)
    j.state = 'running'
    j.attempts = tostring(tonumber(j.attempts) + 1)
    j.worker, j.lease_token, j.lease_expires_at = ARGV[3], ARGV[4], expires
    j.started_at = now_s
    j.progress, j.progress_message = nil, nil
    save(j, {'state', 'attempts', 'worker', 'lease_token', 'lease_expires_at', 'started_at',
             'progress', 'progress_message'})
    enter(j)
    local l = limited[j.queue]
    if l == nil then
        l = limits_of(j.queue) or false
        limited[j.queue] = l
    end
    if l and (l.rate or l.key_rate) then
        local mark = tostring(redis.call('INCR', P .. 'startseq'))
        redis.call('ZADD', qk('starts', j.queue), now_s, mark)
        if j.limit_key then
            redis.call('ZADD', kk('kstarts', j.queue, j.limit_key), now_s, mark)
            redis.call('SADD', qk('kstartkeys', j.queue), j.limit_key)
        end
    end
    claimed[#claimed + 1] = j
    out[#out + 1] = reply_of(j)
end
for q, l in pairs(limited) do
    if l then prune_starts(q, l, now_n, tonumber(ARGV[8])) end
end
table.sort(claimed, function(a, b) return tonumber(a.id) < tonumber(b.id) end)
for _, j in ipairs(claimed) do event(j, 'claimed', tonumber(j.attempts), now_s, nil) end
return done({out, unreadable})
