-- name: job_finish
-- uses flows.lua
-- ARGV: now ('' = Redis's clock), items (JSON [[id, token, kind, result, error,
-- run_at], ...]).
-- The one script that ends running jobs, for every kind of outcome (see
-- finish_all in common.lua): each item names the lease it was claimed under,
-- and a stale token changes nothing. Returns {the ids changed, the jobs it could
-- not read (unreadable)}.
gather = true -- the sorted-set writes sent at done() (see zwrite)
local now_n, now_s = clock(ARGV[1])
local ids = finish_all(cjson.decode(ARGV[2]), now_n, now_s)
flow_release(ids, now_s) -- jobs waiting for these (flows.lua)
return done({ids, unreadable})
