-- name: job_claim
-- ARGV: queues (JSON), limit, worker, token, lease seconds, now ('' = Redis's
-- clock), group ('' = any), slack seconds.
-- Moves up to :limit jobs that may start (see candidates in common.lua) to
-- running under a fresh lease token; a limited queue records its starts for
-- the rates. Returns {the jobs, in claim order, the jobs it could not read}.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[6])
local expires = fmt(now_n + tonumber(ARGV[5]))
local out, limited = {}, {}
local CLAIMED = {'state', 'attempts', 'worker', 'lease_token', 'lease_expires_at', 'started_at'}
for _, c in ipairs(candidates(cjson.decode(ARGV[1]), tonumber(ARGV[2]), now_n, v(ARGV[7] ~= '' and ARGV[7]))) do
    local j, q = c[4], c[3]
    leave(j)
    j.state, j.attempts, j.worker = 'running', tostring(tonumber(j.attempts) + 1), ARGV[3]
    j.lease_token, j.lease_expires_at, j.started_at = ARGV[4], expires, now_s
    save(j, CLAIMED)
    enter(j)
    if j.progress or j.progress_message then -- an earlier attempt's
        j.progress, j.progress_message = nil, nil
        save(j, {'progress', 'progress_message'})
    end
    if limited[q] == nil then limited[q] = limits_of(q) or false end
    local l = limited[q]
    if l and (l.rate or l.key_rate) then
        local mark = tostring(redis.call('INCR', P .. 'startseq'))
        redis.call('ZADD', qk('starts', q), now_s, mark)
        if j.limit_key then
            redis.call('ZADD', kk('kstarts', q, j.limit_key), now_s, mark)
            redis.call('SADD', qk('kstartkeys', q), j.limit_key)
        end
    end
    out[#out + 1] = reply_of(j)
end
for q, l in pairs(limited) do
    if l then prune_starts(q, l, now_n, tonumber(ARGV[8])) end
end
return done({out, unreadable})
