-- An enqueue of a key with on_conflict="replace" (conveyor/replace.py), in the
-- insert's transaction, before its key lookup.

-- name: job_replace
-- The queued job holding the key takes the enqueue's arguments, run_at and
-- priority, with its event; the row lock re-reads a job claimed meanwhile, which
-- is then no longer queued and is left alone. A held job stays held: the new
-- run_at is kept for it in held_run_at (SET reads the old row).
WITH changed AS (
    UPDATE jobs
    SET args = %(args)s::json, kwargs = %(kwargs)s::json, priority = %(priority)s,
        run_at = CASE WHEN run_at >= %(hold_at)s THEN run_at ELSE %(run_at)s END,
        held_run_at = CASE WHEN run_at >= %(hold_at)s THEN %(run_at)s ELSE held_run_at END
    WHERE queue = %(queue)s AND key = %(key)s AND state = 'queued'
    RETURNING *
), replaced AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'replaced', attempts, %(now)s FROM changed
), notified AS (
    SELECT count(pg_notify('conveyor_jobs', queue)) FROM changed
)
SELECT changed.* FROM changed, notified

-- name: job_key_release
-- A running job holding the key gives it up (its arguments never change): the
-- insert that follows gives the key to a new job.
UPDATE jobs SET key = NULL WHERE queue = %(queue)s AND key = %(key)s AND state = 'running'
