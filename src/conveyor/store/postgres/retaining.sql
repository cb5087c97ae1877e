-- Retention per job (conveyor/retain.py): rules written with the jobs that have
-- one, and the round that deletes the finished jobs past theirs.

-- name: job_set_retain
-- Run in the insert's own transaction, only for jobs enqueued with retain=:
-- the enqueue's statement itself stays the one every job pays for.
UPDATE jobs SET retain = d.retain::jsonb
FROM unnest(%(ids)s::bigint[], %(values)s::text[]) AS d(id, retain)
WHERE jobs.id = d.id

-- name: job_purge_retained
-- The finished jobs whose own rule for the state they ended in has run out at
-- %(now)s, at most %(limit)s, from the partial index jobs_retaining: the rule is
-- judged here, on the row as it is when locked, so a job retried meanwhile (no
-- longer finished) stays. Run with finished_counts_lock held (delete_doomed).
WITH doomed AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE retain IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled')
      AND retain ? state
      AND finished_at + make_interval(secs => (retain ->> state)::float8) <= %(now)s
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
{{conveyor.store.postgres/queries.sql:delete_doomed}}
SELECT count(*) FROM gone

-- name: job_retain
SELECT id, retain::text FROM jobs WHERE id = ANY(%(ids)s::bigint[]) AND retain IS NOT NULL
