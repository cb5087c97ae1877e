-- Workflows: jobs that wait for other jobs (see conveyor/store/flows.py for the
-- rules and docs/workflows.md). Every statement takes its jobs as arrays: one
-- statement per step, however many edges it touches. They run in the
-- transaction of the insert, finish or cancel they follow.

-- with: conveyor.store/workflows.sql as pyformat

-- name: flow_parent_states
-- The state of each named job that exists (the parents of new jobs, this
-- insert's own among them), locked until the insert commits, in id order as
-- every statement that locks several jobs does. A parent that has not ended is
-- marked waited_on, once: its finish passes the row over while it is held,
-- then reads it, sees waited_on and resolves the new edges (see job_finish in
-- queries.sql); a finish that committed first is seen here as the parent's
-- end. An ended parent is not written: its edges are resolved at once.
WITH locked AS (
    SELECT id, state, waited_on FROM jobs WHERE id = ANY(%(ids)s::bigint[])
    ORDER BY id FOR UPDATE
), marked AS (
    UPDATE jobs SET waited_on = true
    FROM locked
    WHERE jobs.id = locked.id AND NOT locked.waited_on
      AND locked.state NOT IN ('succeeded', 'failed', 'cancelled')
)
SELECT id, state FROM locked

-- name: flow_edges_insert
-- An edge is written only onto a job that exists and is older than its child
-- (ids are drawn from one sequence in order): no job waits for itself or for one
-- enqueued after it, so no cycle can form. The caller refuses the insert when an
-- edge is missing from the rows returned.
INSERT INTO job_edges (child, parent, resolved)
SELECT e.child, e.parent, e.resolved
FROM unnest(%(children)s::bigint[], %(parents)s::bigint[], %(resolved)s::text[])
     AS e(child, parent, resolved)
WHERE e.parent < e.child AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = e.parent)
RETURNING child, parent

-- name: flow_jobs_insert
INSERT INTO job_flows (job_id, pending, on_failure, workflow)
SELECT * FROM unnest(%(jobs)s::bigint[], %(pending)s::integer[], %(on_failure)s::text[],
                     %(workflows)s::text[])

-- name: flow_wait
-- New jobs whose parents have not all ended: out of the claim's indexes.
UPDATE jobs SET state = 'waiting' WHERE id = ANY(%(ids)s::bigint[]) AND state = 'queued'

-- name: flow_resolve
-- The edges onto jobs of %(ids)s that ended (and were not resolved before):
-- each resolved once, with the state its parent ended in.
UPDATE job_edges SET resolved = p.state
FROM jobs AS p
WHERE job_edges.parent = ANY(%(ids)s::bigint[])
  AND job_edges.resolved IS NULL
  AND p.id = job_edges.parent
  AND p.state IN ('succeeded', 'failed', 'cancelled')
RETURNING job_edges.child, job_edges.parent, job_edges.resolved

-- name: flow_count_down
-- Fewer parents pending. The rows are locked in id order first, so two finishes
-- counting down the same children never deadlock; the second waits for the
-- first and counts down from what it committed: one of them sees zero.
WITH locked AS (
    SELECT job_id FROM job_flows WHERE job_id = ANY(%(jobs)s::bigint[])
    ORDER BY job_id FOR UPDATE
)
UPDATE job_flows SET pending = pending - d.n
FROM unnest(%(jobs)s::bigint[], %(counts)s::integer[]) AS d(job_id, n), locked
WHERE job_flows.job_id = d.job_id AND locked.job_id = d.job_id
RETURNING job_flows.job_id, job_flows.pending, job_flows.on_failure

-- name: flow_ready
-- Waiting jobs whose last parent just ended: claimable from now on; their
-- queues' workers are woken at commit.
WITH made AS (
    UPDATE jobs SET state = 'queued'
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'waiting'
    RETURNING id, queue, task, attempts
), made_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'ready', attempts, coalesce(%(now)s::timestamptz, now())
    FROM made ORDER BY id
)
SELECT made.id
FROM made,
     (SELECT count(pg_notify('conveyor_jobs', q.queue))
      FROM (SELECT DISTINCT queue FROM made) AS q) AS woken

-- name: flow_cancel
-- Waiting jobs ended by a parent's failure or cancel (errors given), or new ones
-- whose parent had already ended so (then %(from_state)s is queued), or an
-- operator's cancel (no errors). Waiters hear of them at commit.
WITH gone AS (
    UPDATE jobs SET state = 'cancelled', finished_at = coalesce(%(now)s::timestamptz, now()),
                    error = coalesce(c.error, jobs.error)
    FROM unnest(%(ids)s::bigint[], %(errors)s::text[]) AS c(id, error)
    WHERE jobs.id = c.id AND jobs.state = %(from_state)s
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.attempts, c.error
), gone_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at, error)
    SELECT id, queue, task, 'cancelled', attempts, coalesce(%(now)s::timestamptz, now()), error
    FROM gone ORDER BY id
)
SELECT gone.id
FROM gone,
     (SELECT count(pg_notify('conveyor_done', d.ids))
      FROM (SELECT string_agg(id::text, ',') AS ids FROM gone GROUP BY id / 400) AS d) AS done

-- name: flow_still_needed
-- Included by the purges (queries.sql): a job with a child not yet ended stays,
-- since a child still to run reads its parents' results (ctx.upstream).
NOT EXISTS (SELECT 1 FROM job_edges AS e JOIN jobs AS c ON c.id = e.child
            WHERE e.parent = jobs.id AND c.state IN ('waiting', 'queued', 'running'))

-- name: flow_orphan
-- Jobs an operator deletes before they ended (running ones are not deleted,
-- and are left alone here): their unresolved edges resolve as 'deleted', so
-- that no job waits for them forever. The jobs are locked first, in id order,
-- as the delete that follows locks them: a claim passes them by meanwhile.
WITH doomed AS (
    SELECT id FROM jobs WHERE id = ANY(%(ids)s::bigint[]) AND state <> 'running'
    ORDER BY id FOR UPDATE
)
UPDATE job_edges SET resolved = 'deleted'
FROM doomed
WHERE job_edges.parent = doomed.id AND job_edges.resolved IS NULL
RETURNING job_edges.child, job_edges.parent, job_edges.resolved
