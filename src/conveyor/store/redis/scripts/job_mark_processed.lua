-- name: job_mark_processed
-- ARGV: id. An outcome reader's compare-and-set: marks a finished job's outcome
-- processed, for this finish (the mark is its finished_at: a job run again and
-- finished anew is unprocessed again). 1 when this call set the mark, else 0.
local f = redis.call('HMGET', jkey(ARGV[1]), 'state', 'finished_at', 'processed_mark')
if f[1] ~= 'succeeded' and f[1] ~= 'failed' and f[1] ~= 'cancelled' then return 0 end
if not f[2] or f[3] == f[2] then return 0 end
redis.call('HSET', jkey(ARGV[1]), 'processed_mark', f[2])
return 1
