-- Statements of retention per final state, holding a job back, and outcome readers.
-- Kept apart from queries.sql: each is new, none changes a statement there.

-- name: job_purge_beyond_in_states
-- job_purge_beyond for some final states only (%(states)s, a text array): the
-- jobs of a queue in those states past its keep newest of them, up to limit.
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE queue = %(queue)s AND state = ANY(%(states)s::text[])
    ORDER BY id DESC
    OFFSET %(keep)s
    LIMIT %(limit)s
), gone AS (
    DELETE FROM jobs
    WHERE id IN (SELECT id FROM doomed) AND state IN ('succeeded', 'failed', 'cancelled')
    RETURNING id, queue, state
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM gone) RETURNING queue, kind, xid, seq
),
{{conveyor.store.postgres/queries.sql:finished_counts_forget}}
SELECT count(*) FROM gone

-- name: job_unprocessed
-- Finished jobs whose outcome no reader has marked processed for this finish,
-- finished at since or later, oldest finish first (jobs_finished's order).
SELECT id FROM jobs
WHERE finished_at >= %(since)s
  AND state = ANY(%(states)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND processed_mark IS DISTINCT FROM finished_at
ORDER BY finished_at, id
LIMIT %(limit)s

-- name: job_mark_processed
-- The compare-and-set of an outcome reader: true for exactly one caller per finish.
UPDATE jobs SET processed_mark = finished_at
WHERE id = %(id)s
  AND state IN ('succeeded', 'failed', 'cancelled')
  AND processed_mark IS DISTINCT FROM finished_at
