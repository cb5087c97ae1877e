-- An enqueue of a key with on_conflict="replace" (conveyor/replace.py), in the
-- insert's write transaction, before its key lookup.

-- name: job_replace
-- The queued job holding the key takes the enqueue's arguments, run_at and
-- priority; the state is checked here, under the write lock. A held job stays
-- held: the new run_at is kept for it in held_run_at (SET reads the old row).
UPDATE jobs
SET args = :args, kwargs = :kwargs, priority = :priority,
    run_at = CASE WHEN run_at >= :hold_at THEN run_at ELSE :run_at END,
    held_run_at = CASE WHEN run_at >= :hold_at THEN :run_at ELSE held_run_at END
WHERE queue = :queue AND key = :key AND state = 'queued'
RETURNING *

-- name: job_key_release
-- A running job holding the key gives it up (its arguments never change): the
-- insert that follows gives the key to a new job.
UPDATE jobs SET key = NULL WHERE queue = :queue AND key = :key AND state = 'running'

-- name: event_insert_replaced
INSERT INTO events (job_id, queue, task, kind, attempt, at)
VALUES (:id, :queue, :task, 'replaced', :attempt, :now)
