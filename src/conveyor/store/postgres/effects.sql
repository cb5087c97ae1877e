-- Exactly-once effects: a job completed in the caller's own transaction, and
-- a job's durable steps (see docs/effects.md).

-- name: job_complete_in
-- A running job's success, written in the caller's open transaction (with the
-- caller's own writes) and fenced by the attempt's lease token, as job_finish
-- records a "complete" outcome: the same row, event and notifications, which
-- only exist once the caller commits. No row when the lease no longer holds.
-- Its row lock is held until the caller commits or rolls back: a finish or a
-- rescue of the job meanwhile waits, then sees the outcome.
WITH changed AS (
    UPDATE jobs
    SET state = 'succeeded',
        finished_at = {{conveyor.store.postgres/queries.sql:now}},
        result = %(result)s::json,
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
    RETURNING id, queue, task, attempts, worker, group_key
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
    SELECT id, queue, task, 'succeeded', attempts, worker,
           {{conveyor.store.postgres/queries.sql:now}}, NULL
    FROM changed
), ended AS (
    SELECT id FROM changed
)
-- Waiters hear of the job; workers hear of its queue when a group may now let
-- its next job through or a concurrency slot was freed (as job_finish).
SELECT changed.id,
       ({{conveyor.store.postgres/queries.sql:notify_done}}),
       CASE WHEN changed.group_key IS NOT NULL
                 OR EXISTS (SELECT 1 FROM limits AS l
                            WHERE l.queue = changed.queue
                              AND (l.concurrency IS NOT NULL OR l.key_concurrency IS NOT NULL))
            THEN pg_notify('conveyor_jobs', changed.queue) END
FROM changed

-- name: step_list
-- The steps a job recorded, in the order they finished.
SELECT name, result, attempt, started_at, finished_at
FROM job_steps WHERE job_id = %(job_id)s
ORDER BY finished_at, name

-- name: step_record
-- Record a step's result, while the attempt's lease holds. A step of that
-- name recorded already (by an attempt that lost its lease in the same
-- moment) is kept: no row then, and the caller reads the one recorded.
INSERT INTO job_steps (job_id, name, result, attempt, started_at, finished_at)
SELECT id, %(name)s, %(result)s::json, attempts, %(started_at)s,
       coalesce(%(now)s::timestamptz, now())
FROM jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
ON CONFLICT (job_id, name) DO NOTHING
RETURNING name, result, attempt, started_at, finished_at

-- name: step_get
SELECT name, result, attempt, started_at, finished_at
FROM job_steps WHERE job_id = %(job_id)s AND name = %(name)s
