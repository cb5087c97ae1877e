-- Exactly-once effects: a job completed in the caller's own transaction, and
-- a job's durable steps (see docs/effects.md).

-- name: job_complete_in
-- A running job's success, written in the caller's open transaction (with the
-- caller's own writes) and fenced by the attempt's lease token, as job_finish
-- records a "complete" outcome; event_insert_completed_in adds its event. No
-- row when the lease no longer holds. The caller's transaction holds the
-- database's write lock until it commits or rolls back.
UPDATE jobs
SET state = 'succeeded',
    finished_at = :now,
    result = :result,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running'
RETURNING id

-- name: event_insert_completed_in
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
SELECT id, queue, task, 'succeeded', attempts, worker, :now, NULL
FROM jobs WHERE id = :id

-- name: step_list
-- The steps a job recorded, in the order they finished.
SELECT name, result, attempt, started_at, finished_at
FROM job_steps WHERE job_id = :job_id
ORDER BY finished_at, name

-- name: step_record
-- Record a step's result, while the attempt's lease holds. A step of that
-- name recorded already is kept: no row then, and the caller reads it.
INSERT INTO job_steps (job_id, name, result, attempt, started_at, finished_at)
SELECT id, :name, :result, attempts, :started_at, :now
FROM jobs
WHERE id = :id AND lease_token = :token AND state = 'running'
ON CONFLICT (job_id, name) DO NOTHING
RETURNING name, result, attempt, started_at, finished_at

-- name: step_get
SELECT name, result, attempt, started_at, finished_at
FROM job_steps WHERE job_id = :job_id AND name = :name
