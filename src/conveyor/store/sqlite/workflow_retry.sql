-- A workflow retried from its failures (conveyor/store/workflow_retry.py): the
-- jobs to run again are chosen by workflow_retry_pick and changed by the
-- statements after it, in one write transaction (SQLite's single writer: what
-- the pick read stays true until it commits).

-- name: workflow_retry_pick
-- The jobs to run again, redo: the workflow's failed jobs, and the cancelled
-- jobs their failure reached (children through edges that resolved failed or
-- cancelled, and theirs in turn; a job an operator cancelled on its own is not
-- reached); each with its queue, its state, and how many of its parents are in
-- redo (it waits for them again).
WITH RECURSIVE redo (id) AS (
    SELECT j.id FROM job_flows AS f JOIN jobs AS j ON j.id = f.job_id
    WHERE f.workflow = :workflow AND j.state = 'failed'
    UNION
    SELECT e.child FROM redo
    JOIN job_edges AS e ON e.parent = redo.id AND e.resolved IN ('failed', 'cancelled')
    JOIN jobs AS c ON c.id = e.child AND c.state = 'cancelled'
)
SELECT j.id, j.queue, j.state,
       (SELECT count(*) FROM job_edges AS e
        WHERE e.child = j.id AND e.parent IN (SELECT id FROM redo))
FROM jobs AS j
WHERE j.id IN (SELECT id FROM redo)
ORDER BY j.id

-- name: workflow_retry_jobs
-- :items is [[id, parents in redo], ...]: each job back as new, waiting when a
-- parent of it runs again, else queued.
UPDATE jobs SET state = CASE WHEN r.value ->> 1 > 0 THEN 'waiting' ELSE 'queued' END,
                {{conveyor.store.sqlite/queries.sql:requeue_fresh}}
FROM json_each(:items) AS r
WHERE jobs.id = r.value ->> 0 AND jobs.state IN ('failed', 'cancelled')
RETURNING jobs.id

-- name: workflow_retry_edges
-- The edges between the jobs of :ids resolve again when their parents end.
UPDATE job_edges SET resolved = NULL
WHERE child IN (SELECT value FROM json_each(:ids))
  AND parent IN (SELECT value FROM json_each(:ids))

-- name: workflow_retry_flows
-- :items is [[id, parents in redo], ...]: the parents each job waits for again.
UPDATE job_flows SET pending = r.value ->> 1
FROM json_each(:items) AS r
WHERE job_flows.job_id = r.value ->> 0

-- name: workflow_retry_events
{{conveyor.store.sqlite/queries.sql:event_insert_for_jobs}}

-- name: workflow_retry_uncount
{{conveyor.store.sqlite/queries.sql:finished_counts_add}}
