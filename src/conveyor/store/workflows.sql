-- The statements of workflows that read the same in both SQL dialects, written
-- once; each dialect's workflows.sql starts from this file (its "-- with:" line,
-- see conveyor.store.sql) and adds what differs. Placeholders are :name.

-- name: flow_parents
-- The jobs a job waits for, with the parent's id and the state each edge
-- resolved in; a parent deleted since has no job (its columns are NULL) and
-- its edge says 'deleted'.
SELECT jobs.*, e.parent, e.resolved FROM job_edges AS e LEFT JOIN jobs ON jobs.id = e.parent
WHERE e.child = :id
ORDER BY e.parent

-- name: flow_children
SELECT jobs.*, e.child, e.resolved FROM job_edges AS e JOIN jobs ON jobs.id = e.child
WHERE e.parent = :id
ORDER BY jobs.id

-- name: stats_waiting
-- Waiting jobs per queue (from jobs_queue_state).
SELECT queue, count(*) FROM jobs WHERE state = 'waiting' GROUP BY queue

-- name: workflow_create
-- The workflow's record, unless its id is taken (then nothing: the caller
-- returns the stored one).
INSERT INTO workflows (id, name, jobs, created_at) VALUES (:id, :name, :jobs, :now)
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: workflow_get
SELECT id, name, jobs, created_at FROM workflows WHERE id = :id

-- name: workflow_list
SELECT id, name, jobs, created_at FROM workflows ORDER BY created_at DESC, id LIMIT :limit

-- name: workflow_jobs
SELECT jobs.* FROM job_flows AS f JOIN jobs ON jobs.id = f.job_id
WHERE f.workflow = :id
ORDER BY jobs.id

-- name: workflow_counts
SELECT jobs.state, count(*) FROM job_flows AS f JOIN jobs ON jobs.id = f.job_id
WHERE f.workflow = :id
GROUP BY jobs.state

-- name: workflow_edges
SELECT e.child, e.parent, e.resolved
FROM job_flows AS f JOIN job_edges AS e ON e.child = f.job_id
WHERE f.workflow = :id
ORDER BY e.child, e.parent

-- name: job_workflow
SELECT workflow FROM job_flows WHERE job_id = :id
