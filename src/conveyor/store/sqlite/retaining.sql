-- Retention per job (conveyor/retain.py): rules written with the jobs that have
-- one, and the round that deletes the finished jobs past theirs.

-- name: job_set_retain
-- Run in the insert's own transaction, only for jobs enqueued with retain=:
-- the enqueue's statement itself stays the one every job pays for. :rules is a
-- JSON list of [id, rule] pairs: one statement for the batch.
UPDATE jobs SET retain = r.value ->> '$[1]'
FROM json_each(:rules) AS r
WHERE jobs.id = r.value ->> '$[0]'

-- name: job_purge_retained_select
-- The finished jobs whose own rule for the state they ended in has run out at
-- :now, at most :limit, from the partial index jobs_retaining; read under the
-- write lock that their delete runs in, so the rule is judged on the rows as
-- they are.
SELECT id FROM jobs
WHERE retain IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled')
  AND finished_at + json_extract(retain, '$.' || state) <= :now
ORDER BY finished_at
LIMIT :limit

-- name: job_retain
SELECT id, retain FROM jobs WHERE id IN (SELECT value FROM json_each(:ids)) AND retain IS NOT NULL
