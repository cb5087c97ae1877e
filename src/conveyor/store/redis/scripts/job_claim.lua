-- name: job_claim
-- ARGV: queues (JSON), limit, worker, token, lease seconds, now ('' = Redis's
-- clock), group ('' = any), slack seconds.
-- Moves up to :limit jobs that may start (see claim and candidates in
-- common.lua) to running under a fresh lease token. Returns {the jobs, in claim
-- order, the jobs it could not read}.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[6])
local out = claim(cjson.decode(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4],
    fmt(now_n + tonumber(ARGV[5])), now_n, now_s, v(ARGV[7] ~= '' and ARGV[7]), tonumber(ARGV[8]))
return done({out, unreadable})
