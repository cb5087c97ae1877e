-- Workflows: jobs that wait for other jobs (see conveyor/store/flows.py for the
-- rules and docs/workflows.md). Every statement takes its jobs as one JSON
-- array: one statement per step, however many edges it touches. They run in
-- the transaction of the insert, finish or cancel they follow.

-- with: conveyor.store/workflows.sql

-- name: flow_parent_states
-- The state of each named job that exists (the parents of new jobs).
SELECT id, state FROM jobs WHERE id IN (SELECT value FROM json_each(:ids))

-- name: flow_edges_insert
-- :items is [[child, parent, resolved], ...]. An edge is written only onto a job
-- that exists and is older than its child (ids are handed out in order): no job
-- waits for itself or for one enqueued after it, so no cycle can form. The
-- caller refuses the insert when an edge is missing from the rows returned.
INSERT INTO job_edges (child, parent, resolved)
SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(:items)
WHERE value ->> 1 < value ->> 0
  AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = value ->> 1)
RETURNING child, parent

-- name: flow_jobs_insert
-- :items is [[job, pending, on_failure, workflow], ...]
INSERT INTO job_flows (job_id, pending, on_failure, workflow)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(:items)

-- name: flow_wait
-- New jobs whose parents have not all ended: out of the claim's indexes.
UPDATE jobs SET state = 'waiting'
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'queued'

-- name: flow_resolve
-- The edges onto jobs of :ids that ended (and were not resolved before): each
-- resolved once, with the state its parent ended in. The edges are searched
-- first (job_edges_parent), and a parent's row read only for an edge found:
-- the finish of jobs that nothing waits for costs an index probe per job.
UPDATE job_edges SET resolved = (SELECT p.state FROM jobs AS p WHERE p.id = job_edges.parent)
WHERE job_edges.parent IN (SELECT value FROM json_each(:ids))
  AND job_edges.resolved IS NULL
  AND (SELECT p.state FROM jobs AS p WHERE p.id = job_edges.parent)
      IN ('succeeded', 'failed', 'cancelled')
RETURNING job_edges.child, job_edges.parent, job_edges.resolved

-- name: flow_count_down
-- :items is [[job, edges resolved now], ...]: fewer parents pending.
UPDATE job_flows SET pending = pending - d.value ->> 1
FROM json_each(:items) AS d
WHERE job_flows.job_id = d.value ->> 0
RETURNING job_flows.job_id, job_flows.pending, job_flows.on_failure

-- name: flow_ready
-- Waiting jobs whose last parent just ended: claimable from now on.
UPDATE jobs SET state = 'queued'
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'waiting'
RETURNING id

-- name: flow_cancel
-- :items is [[job, error], ...]: waiting jobs a parent's failure or cancel ends.
UPDATE jobs SET state = 'cancelled', finished_at = :now, error = c.value ->> 1
FROM json_each(:items) AS c
WHERE jobs.id = c.value ->> 0 AND jobs.state = 'waiting'
RETURNING jobs.id

-- name: flow_cancel_new
-- :items is [[job, error], ...]: new jobs whose parent had already failed.
UPDATE jobs SET state = 'cancelled', finished_at = :now, error = c.value ->> 1
FROM json_each(:items) AS c
WHERE jobs.id = c.value ->> 0 AND jobs.state = 'queued'
RETURNING jobs.id

-- name: flow_cancel_waiting
-- An operator's cancel of waiting jobs (job_cancel_many cancels the queued ones).
UPDATE jobs SET state = 'cancelled', finished_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'waiting'
RETURNING id

-- name: flow_events
-- :kind for each job of :ids, its error with it (ready, cancelled).
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
SELECT id, queue, task, :kind, attempts, NULL, :now,
       CASE WHEN :kind = 'cancelled' THEN error END
FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids))
ORDER BY id

-- name: flow_keep
-- Of :ids (about to be purged), the jobs with children not yet ended: a child
-- still to run reads its parents' results (ctx.upstream).
SELECT DISTINCT e.parent FROM job_edges AS e JOIN jobs AS c ON c.id = e.child
WHERE e.parent IN (SELECT value FROM json_each(:ids))
  AND c.state IN ('waiting', 'queued', 'running')

-- name: flow_forget
-- Deleted jobs take their own edges (onto their parents) with them.
DELETE FROM job_edges WHERE child IN (SELECT value FROM json_each(:ids))

-- name: flow_forget_parents
-- The edges onto deleted jobs from children that stay are kept, resolved as
-- 'deleted': a child still to run names the parent that is gone
-- (ctx.upstream_errors) rather than leave it out. They go with the child.
UPDATE job_edges SET resolved = 'deleted'
WHERE parent IN (SELECT value FROM json_each(:ids)) AND resolved IS NOT 'deleted'

-- name: flow_forget_jobs
DELETE FROM job_flows WHERE job_id IN (SELECT value FROM json_each(:ids))

-- name: flow_orphan
-- Jobs an operator deletes before they ended (running ones are not deleted):
-- their unresolved edges resolve as 'deleted', so that no job waits for them
-- forever.
UPDATE job_edges SET resolved = 'deleted'
FROM jobs AS p
WHERE job_edges.parent IN (SELECT value FROM json_each(:ids))
  AND job_edges.resolved IS NULL
  AND p.id = job_edges.parent
  AND p.state <> 'running'
RETURNING job_edges.child, job_edges.parent, job_edges.resolved
