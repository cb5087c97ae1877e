-- Expiry (conveyor/expiry.py): deadlines written with the jobs that have one,
-- and the maintenance sweep that ends the queued jobs past theirs.

-- name: job_insert_expiring
-- job_insert (queries.sql) with the deadline column, for a batch in which a job
-- has one: the plain insert stays the one every other job pays for.
INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                  key, group_key, batch, created_at, limit_key, headers, expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: job_expire
-- The queued jobs whose deadline has passed (:now), at most :limit, oldest
-- deadline first, from the partial index jobs_expiring: cancelled with the
-- expiry's error. The state is checked here, under the write lock, so a job a
-- claim took first is left alone.
UPDATE jobs SET state = 'cancelled', finished_at = :now, error = :error
WHERE id IN (
    SELECT id FROM jobs
    WHERE state = 'queued' AND expires_at IS NOT NULL AND expires_at <= :now
    ORDER BY expires_at
    LIMIT :limit)
RETURNING id

-- name: event_insert_expired
-- The event of each job job_expire ended: cancelled, with the expiry's error.
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
SELECT id, queue, task, 'cancelled', attempts, worker, :now, error
FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: job_expires_at
SELECT id, expires_at FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND expires_at IS NOT NULL

-- name: job_expired_counts
-- From the partial index jobs_expired (cancelled jobs that had a deadline).
SELECT queue, count(*) FROM jobs
WHERE state = 'cancelled' AND expires_at IS NOT NULL AND error = :error
GROUP BY queue
