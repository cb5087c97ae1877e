-- Signals and parked waits (app.signal, ctx.wait_for; docs/durable.md). A
-- signal and a wait both lock the job's row first (signal_lock_job,
-- wait_lock_job) and read the other's rows in a later statement of their
-- transaction: under READ COMMITTED that statement sees what the other
-- committed, so a signal written first is taken by the wait, and a wait
-- parked first is woken by the signal; never neither.

-- name: signal_lock_job
SELECT state FROM jobs WHERE id = %(job_id)s FOR UPDATE

-- name: signal_insert
-- Kept for a live job only: a finished job will never take it.
INSERT INTO job_signals (job_id, name, payload, sent_at)
SELECT id, %(name)s, %(payload)s, %(now)s FROM jobs
WHERE id = %(job_id)s AND state IN ('waiting', 'queued', 'running')
RETURNING id

-- name: signal_wake
-- The job parked until this signal (or its timeout) is due now; its queue's
-- workers hear of it.
WITH changed AS (
    UPDATE jobs SET run_at = %(now)s
    WHERE id = %(job_id)s AND state = 'queued' AND run_at > %(now)s
      AND EXISTS (SELECT 1 FROM job_waits w WHERE w.job_id = jobs.id AND w.signal = %(name)s)
    RETURNING id, queue
), notified AS (
    {{conveyor.store.postgres/queries.sql:notify_queues}}
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: wait_lock_job
SELECT id FROM jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
FOR UPDATE

-- name: signal_take
-- Step %(step)s as recorded, when an earlier attempt's wait recorded it (a
-- replay's answer: no signal is taken, since nothing could record it); else the
-- oldest signal of that name no wait took yet, taken by the step and recorded
-- as the step in the same statement, so that a replay returns the same
-- payload. The caller holds the job's row under the attempt's lease: no other
-- transaction records the step meanwhile.
WITH recorded AS (
    SELECT name, result, attempt, started_at, finished_at FROM job_steps
    WHERE job_id = %(id)s AND name = %(step)s
), taken AS (
    UPDATE job_signals SET received_at = %(now)s, step = %(step)s
    WHERE id = (
        SELECT id FROM job_signals
        WHERE job_id = %(id)s AND name = %(name)s AND received_at IS NULL
        ORDER BY id LIMIT 1
        FOR UPDATE)
      AND NOT EXISTS (SELECT 1 FROM recorded)
    RETURNING job_id, step, payload
), inserted AS (
    INSERT INTO job_steps (job_id, name, result, attempt, started_at, finished_at)
    SELECT jobs.id, taken.step, ('{"payload": ' || taken.payload || '}')::json, jobs.attempts,
           %(now)s, %(now)s
    FROM taken JOIN jobs ON jobs.id = taken.job_id
    RETURNING name, result, attempt, started_at, finished_at
)
SELECT * FROM inserted
UNION ALL
SELECT * FROM recorded

-- name: wait_mark
-- The job waits (step %(step)s, for signal %(name)s or children %(children)s)
-- until %(until)s. A wait of the same step marked by an earlier attempt keeps
-- its time: a replay does not start the timeout again. Answers the time the
-- wait ends.
INSERT INTO job_waits (job_id, step, signal, children, until)
VALUES (%(id)s, %(step)s, %(name)s, %(children)s, %(until)s)
ON CONFLICT (job_id) DO UPDATE SET
    until = CASE WHEN job_waits.step = excluded.step THEN job_waits.until ELSE excluded.until END,
    step = excluded.step, signal = excluded.signal, children = excluded.children
RETURNING until

-- name: wait_end
DELETE FROM job_waits WHERE job_id = %(id)s

-- name: wait_get
SELECT step, signal, children, until FROM job_waits WHERE job_id = %(job_id)s

-- name: signal_list
-- A job's signals, in the order they were sent.
SELECT id, name, payload, sent_at, received_at, step
FROM job_signals WHERE job_id = %(job_id)s ORDER BY id

-- name: children_live
-- How many of the children waited for have not ended yet.
SELECT count(*) FROM jobs
WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('waiting', 'queued', 'running')

-- name: children_mark
-- The job waits (step %(step)s) for its children until %(until)s (when it looks
-- again); the caller holds the job's row under the attempt's lease.
INSERT INTO job_waits (job_id, step, signal, children, until)
VALUES (%(id)s, %(step)s, NULL, %(children)s, %(until)s)
ON CONFLICT (job_id) DO UPDATE SET
    until = excluded.until, step = excluded.step, signal = NULL, children = excluded.children
RETURNING until

-- name: sleep_mark
-- The job sleeps (ctx.sleep, step %(step)s) until %(until)s, while the attempt's
-- lease holds: marked as a wait with neither signal nor children, so that the
-- job shows what it waits for and is counted as parked. A mark of the same step
-- keeps its time: a replay after a crash sleeps on, and an operator's wake
-- (wait_wake) ends the sleep. Answers the time the sleep ends.
INSERT INTO job_waits (job_id, step, signal, children, until)
SELECT id, %(step)s, NULL, NULL, %(until)s FROM jobs
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'
ON CONFLICT (job_id) DO UPDATE SET
    until = CASE WHEN job_waits.step = excluded.step THEN job_waits.until ELSE excluded.until END,
    step = excluded.step, signal = NULL, children = NULL
RETURNING until

-- name: sleep_end
-- The sleep is over: the job waits no more.
DELETE FROM job_waits WHERE job_id = %(id)s AND until <= %(now)s

-- name: wait_wake
-- An operator wakes a parked job early (queued, not due yet): its wait ends now
-- (a sleep is over, a signal's wait times out, a wait for children looks again).
UPDATE job_waits SET until = %(now)s
WHERE job_id = %(job_id)s AND until > %(now)s
  AND EXISTS (SELECT 1 FROM jobs
              WHERE id = %(job_id)s AND state = 'queued' AND run_at > %(now)s)
RETURNING job_id

-- name: wait_wake_job
-- The job woken is due now; its queue's workers hear of it.
WITH changed AS (
    UPDATE jobs SET run_at = %(now)s
    WHERE id = %(job_id)s AND state = 'queued' AND run_at > %(now)s
    RETURNING id, queue
), notified AS (
    {{conveyor.store.postgres/queries.sql:notify_queues}}
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: parked_counts
-- Per queue, the jobs parked by a wait: queued for the wait's end, not due yet
-- (a signal or an operator that made one due has woken it).
SELECT jobs.queue, count(*) FROM job_waits JOIN jobs ON jobs.id = job_waits.job_id
WHERE jobs.state = 'queued' AND jobs.run_at > %(now)s
GROUP BY jobs.queue

-- name: cancel_with_children
-- The jobs an operator's cancel of %(ids)s reaches: each queued parent among them
-- parked waiting for its children (ctx.wait) brings its children, and theirs in
-- turn, as the cancel of the parent's own wait cancels them.
WITH RECURSIVE reached(id) AS (
    SELECT unnest(%(ids)s::bigint[])
    UNION
    SELECT child.value::bigint
    FROM reached
    JOIN jobs parent ON parent.id = reached.id AND parent.state = 'queued'
    JOIN job_waits w ON w.job_id = parent.id AND w.children IS NOT NULL
    CROSS JOIN LATERAL json_array_elements_text(w.children::json) AS child(value)
)
SELECT id FROM reached ORDER BY id
