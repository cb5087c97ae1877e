-- name: job_finish
-- uses flows.lua
-- ARGV: now ('' = Redis's clock), items (JSON [[id, token, kind, result, error,
-- run_at], ...]); to fetch the next jobs as well: queues (JSON), limit, worker,
-- token, lease seconds, slack seconds (job_claim's).
-- The one script that ends running jobs, for every kind of outcome (see
-- finish_all in common.lua): each item names the lease it was claimed under,
-- and a stale token changes nothing. A worker's finish may then claim up to
-- :limit jobs for the slots its outcomes free (claim in common.lua: the same
-- rule as job_claim, after the outcomes, so a group's next job or a job these
-- released may be among them): one round trip where a finish and a claim took
-- two. Returns {the ids changed, the jobs it could not read (unreadable), the
-- jobs claimed}.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[1])
local ids = finish_all(cjson.decode(ARGV[2]), now_n, now_s)
flow_release(ids, now_s) -- jobs waiting for these (flows.lua)
local fetched = {}
if ARGV[3] and tonumber(ARGV[4]) > 0 then
    fetched = claim(cjson.decode(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6],
        fmt(now_n + tonumber(ARGV[7])), now_n, now_s, nil, tonumber(ARGV[8]))
end
return done({ids, unreadable, fetched})
