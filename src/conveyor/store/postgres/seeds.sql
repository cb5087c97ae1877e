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
