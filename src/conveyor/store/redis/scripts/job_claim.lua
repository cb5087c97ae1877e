-- name: job_claim
-- ARGV: queues (JSON), limit, worker, token, lease seconds, now ('' = Redis's
-- clock), group ('' = any), slack seconds.
-- Moves up to :limit jobs that may start (see claim and candidates in
-- common.lua) to running under a fresh lease token. A claim that took fewer
-- than :limit also says when the next job could start (next_moment: what
-- next_run_in, which a worker asks right after such a claim, would answer).
-- Returns {the jobs, in claim order, the jobs it could not read, {now, moment}
-- or {now} when it took fewer, else {}}.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[6])
local queues, limit = cjson.decode(ARGV[1]), tonumber(ARGV[2])
local group = v(ARGV[7] ~= '' and ARGV[7])
local out = claim(queues, limit, ARGV[3], ARGV[4], fmt(now_n + tonumber(ARGV[5])), now_n, now_s,
    group, tonumber(ARGV[8]))
local due = {}
if #out < limit then due = next_moment(queues, now_n, now_s, group) end
return done({out, unreadable, due})
