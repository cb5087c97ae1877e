-- A job's durable steps (see docs/effects.md). (A job completed in the caller's
-- own transaction is job_finish, run on the caller's connection.)

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
