-- Statements of holding a job back and of outcome readers (kept apart from
-- queries.sql: none changes a statement there).

-- name: job_unprocessed
-- Finished jobs whose outcome no reader has marked processed for this finish,
-- finished at :since or later, oldest finish first (jobs_finished's order).
SELECT id FROM jobs
WHERE finished_at >= :since
  AND state IN (SELECT value FROM json_each(:states))
  AND (:queue IS NULL OR queue = :queue)
  AND (processed_mark IS NULL OR processed_mark <> finished_at)
ORDER BY finished_at, id
LIMIT :limit

-- name: job_mark_processed
-- The compare-and-set of an outcome reader: true for exactly one caller per finish.
UPDATE jobs SET processed_mark = finished_at
WHERE id = :id
  AND state IN ('succeeded', 'failed', 'cancelled')
  AND (processed_mark IS NULL OR processed_mark <> finished_at)

-- name: job_hold
-- Queued jobs of :ids not held yet are parked at :hold_at (see the migration held_jobs);
-- running and finished jobs are left alone. The events: event_insert_for_jobs.
UPDATE jobs
SET held_run_at = run_at, run_at = :hold_at
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'queued' AND run_at < :hold_at
RETURNING id

-- name: job_unhold
-- Held jobs of :ids get their run_at back (due now if it has passed).
UPDATE jobs
SET run_at = coalesce(held_run_at, :now), held_run_at = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'queued' AND run_at >= :hold_at
RETURNING id

-- name: job_held
-- Held jobs (of :queue, or of all), newest first, below :before_id.
SELECT id FROM jobs
WHERE state = 'queued' AND run_at >= :hold_at
  AND (:queue IS NULL OR queue = :queue)
  AND id < :before_id
ORDER BY id DESC
LIMIT :limit
