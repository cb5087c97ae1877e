-- name: next_run_in
-- ARGV: queues (JSON), now ('' = Redis's clock), group ('' = any).
-- The next moment a claim on :queues could start a job that it cannot now (see
-- next_moment in common.lua). Returns {{now, moment} as strings, or {now} when
-- there is none, the jobs its look at the candidates could not read (unreadable)}.
local now_n, now_s = clock(ARGV[2])
local group = ARGV[3] ~= '' and ARGV[3] or nil
return done({next_moment(cjson.decode(ARGV[1]), now_n, now_s, group), unreadable})
