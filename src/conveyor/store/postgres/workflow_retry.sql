-- A workflow retried from its failures (conveyor/store/workflow_retry.py), in
-- one statement: the rule is decided here, not between round trips.

-- name: workflow_retry
-- The jobs to run again, redo: the workflow's failed jobs, and the cancelled
-- jobs their failure reached (children through edges that resolved failed or
-- cancelled, and theirs in turn; a job an operator cancelled on its own is not
-- reached). Each goes back as new (attempts reset, error and result cleared,
-- a manual_retry event): waiting again, with its edges from the jobs of redo
-- unresolved and its pending count set, when one of its parents runs again,
-- else queued. Succeeded jobs keep their results, and the edges from them
-- stay resolved. A job of redo whose key another live job took now makes the
-- whole statement fail (jobs_live_key): the store says so, and nothing changes.
WITH RECURSIVE redo (id) AS (
    SELECT j.id FROM job_flows AS f JOIN jobs AS j ON j.id = f.job_id
    WHERE f.workflow = %(workflow)s AND j.state = 'failed'
    UNION
    SELECT e.child FROM redo
    JOIN job_edges AS e ON e.parent = redo.id AND e.resolved IN ('failed', 'cancelled')
    JOIN jobs AS c ON c.id = e.child AND c.state = 'cancelled'
), locked AS (
    SELECT j.id, j.state FROM jobs AS j
    WHERE j.id IN (SELECT id FROM redo) AND j.state IN ('failed', 'cancelled')
    ORDER BY j.id
    FOR UPDATE
), counted AS (
    SELECT l.id, l.state,
           (SELECT count(*) FROM job_edges AS e
            WHERE e.child = l.id AND e.parent IN (SELECT id FROM locked)) AS pending
    FROM locked AS l
), changed AS (
    UPDATE jobs SET state = CASE WHEN c.pending > 0 THEN 'waiting' ELSE 'queued' END,
                    {{conveyor.store.postgres/queries.sql:requeue_fresh}}
    FROM counted AS c
    WHERE jobs.id = c.id AND jobs.state = c.state
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.attempts, jobs.state, c.state AS was,
              c.pending
), edges_reset AS (
    UPDATE job_edges SET resolved = NULL
    WHERE child IN (SELECT id FROM changed) AND parent IN (SELECT id FROM changed)
), flows_reset AS (
    UPDATE job_flows SET pending = changed.pending
    FROM changed
    WHERE job_flows.job_id = changed.id
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'manual_retry', attempts, %(now)s FROM changed ORDER BY id
),
{{conveyor.store.postgres/queries.sql:finished_counts_retried}},
notified AS (
    SELECT pg_notify('conveyor_jobs', queue)
    FROM (SELECT DISTINCT queue FROM changed WHERE state = 'queued') AS q
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n
