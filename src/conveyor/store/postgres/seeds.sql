-- Statements of holding a job back and of outcome readers (kept apart from
-- queries.sql: none changes a statement there).

-- name: job_unprocessed
-- Finished jobs whose outcome no reader has marked processed for this finish,
-- finished at since or later, oldest finish first (jobs_finished's order).
SELECT id FROM jobs
WHERE finished_at >= %(since)s
  AND state = ANY(%(states)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND processed_mark IS DISTINCT FROM finished_at
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: job_mark_processed
-- The compare-and-set of an outcome reader: true for exactly one caller per finish.
UPDATE jobs SET processed_mark = finished_at
WHERE id = %(id)s
  AND state IN ('succeeded', 'failed', 'cancelled')
  AND processed_mark IS DISTINCT FROM finished_at

-- name: job_hold
-- Queued jobs of ids not held yet are parked at hold_at (see the migration held_jobs);
-- running and finished jobs are left alone. Each gets its held event.
WITH changed AS (
    UPDATE jobs
    SET held_run_at = run_at, run_at = %(hold_at)s
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'queued' AND run_at < %(hold_at)s
    RETURNING id, queue, task, attempts
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'held', attempts, %(now)s FROM changed ORDER BY id
)
SELECT id FROM changed

-- name: job_unhold
-- Held jobs of ids get their run_at back (due now if it has passed); the
-- workers of their queues are woken at commit.
WITH changed AS (
    UPDATE jobs
    SET run_at = coalesce(held_run_at, %(now)s), held_run_at = NULL
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'queued' AND run_at >= %(hold_at)s
    RETURNING id, queue, task, attempts
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'unheld', attempts, %(now)s FROM changed ORDER BY id
), notified AS (
    SELECT pg_notify('conveyor_jobs', queue) FROM (SELECT DISTINCT queue FROM changed) AS q
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: job_held
-- Held jobs (of queue, or of all), newest first, below before_id.
SELECT id FROM jobs
WHERE state = 'queued' AND run_at >= %(hold_at)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND id < %(before_id)s
ORDER BY id DESC
LIMIT %(limit)s
