-- Expiry (conveyor/expiry.py): deadlines written with the jobs that have one,
-- and the maintenance sweep that ends the queued jobs past theirs.

-- name: job_set_expiry
-- Run in the insert's own transaction, only for jobs enqueued with expires=:
-- the enqueue's statement itself stays the one every job pays for.
UPDATE jobs SET expires_at = d.expires_at
FROM unnest(%(ids)s::bigint[], %(values)s::timestamptz[]) AS d(id, expires_at)
WHERE jobs.id = d.id

-- name: job_expire
-- The queued jobs whose deadline has passed, at most %(limit)s, oldest
-- deadline first, from the partial index jobs_expiring: cancelled with the
-- expiry's error, each with its event, their waiters told. SKIP LOCKED passes
-- the rows a claim is taking; the lock re-reads a row changed meanwhile, so a
-- job claimed first is no longer queued here and stays as the claim left it.
WITH picked AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE state = 'queued' AND expires_at IS NOT NULL
      AND expires_at <= {{conveyor.store.postgres/queries.sql:now}}
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), ended AS (
    UPDATE jobs
    SET state = 'cancelled', finished_at = {{conveyor.store.postgres/queries.sql:now}},
        error = %(error)s
    WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND state = 'queued'
    RETURNING id, queue, task, attempts, worker, error, finished_at
), expired_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
    SELECT id, queue, task, 'cancelled', attempts, worker, finished_at, error
    FROM ended ORDER BY id
)
SELECT ended.id FROM ended, ({{conveyor.store.postgres/queries.sql:notify_done}}) AS done

-- name: job_expires_at
SELECT id, expires_at FROM jobs WHERE id = ANY(%(ids)s::bigint[]) AND expires_at IS NOT NULL

-- name: job_expired_counts
-- From the partial index jobs_expired (cancelled jobs that had a deadline).
SELECT queue, count(*) FROM jobs
WHERE state = 'cancelled' AND expires_at IS NOT NULL AND error = %(error)s
GROUP BY queue
