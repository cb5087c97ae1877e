-- Signals and parked waits (app.signal, ctx.wait_for; docs/durable.md). Each
-- statement runs in one write transaction (SQLite's single write lock), so a
-- signal and the wait it may wake are ordered one after the other: a signal
-- written first is taken by the wait; a wait parked first is woken by it.

-- name: signal_job_state
SELECT state FROM jobs WHERE id = :job_id

-- name: signal_insert
-- Kept for a live job only: a finished job will never take it.
INSERT INTO job_signals (job_id, name, payload, sent_at)
SELECT id, :name, :payload, :now FROM jobs
WHERE id = :job_id AND state IN ('waiting', 'queued', 'running')
RETURNING id

-- name: signal_wake
-- The job parked until this signal (or its timeout) is due now.
UPDATE jobs SET run_at = :now
WHERE id = :job_id AND state = 'queued' AND run_at > :now
  AND EXISTS (SELECT 1 FROM job_waits w WHERE w.job_id = jobs.id AND w.signal = :name)
RETURNING id

-- name: signal_take
-- The oldest signal of that name no wait took yet, taken by step :step, while
-- the attempt's lease holds and the step is not recorded yet: taken once, and
-- recorded as the step in the same transaction (signal_take_step), so that a
-- replay returns the same payload. A step recorded already (an earlier
-- attempt's wait) takes nothing, since nothing could record it: the caller
-- answers the step as recorded (signal_step_recorded).
UPDATE job_signals SET received_at = :now, step = :step
WHERE id = (
    SELECT s.id FROM job_signals s JOIN jobs ON jobs.id = s.job_id
    WHERE s.job_id = :id AND s.name = :name AND s.received_at IS NULL
      AND jobs.lease_token = :token AND jobs.state = 'running'
      AND NOT EXISTS (SELECT 1 FROM job_steps st WHERE st.job_id = :id AND st.name = :step)
    ORDER BY s.id LIMIT 1)
RETURNING payload

-- name: signal_take_step
-- No ON CONFLICT: signal_take took the signal only for a step not recorded yet.
INSERT INTO job_steps (job_id, name, result, attempt, started_at, finished_at)
SELECT jobs.id, s.step, '{"payload": ' || s.payload || '}', jobs.attempts, :now, :now
FROM job_signals s JOIN jobs ON jobs.id = s.job_id
WHERE s.job_id = :id AND s.step = :step
RETURNING name, result, attempt, started_at, finished_at

-- name: signal_step_recorded
-- The step as an earlier attempt's wait recorded it, while the attempt's lease holds.
SELECT st.name, st.result, st.attempt, st.started_at, st.finished_at
FROM job_steps st JOIN jobs ON jobs.id = st.job_id
WHERE st.job_id = :id AND st.name = :step
  AND jobs.lease_token = :token AND jobs.state = 'running'

-- name: wait_mark
-- The job waits (step :step, for signal :name or children :children) until
-- :until, while the attempt's lease holds. A wait of the same step marked by
-- an earlier attempt keeps its time: a replay does not start the timeout again.
-- Answers the time the wait ends.
INSERT INTO job_waits (job_id, step, signal, children, until)
SELECT id, :step, :name, :children, :until FROM jobs
WHERE id = :id AND lease_token = :token AND state = 'running'
ON CONFLICT (job_id) DO UPDATE SET
    until = CASE WHEN job_waits.step = excluded.step THEN job_waits.until ELSE excluded.until END,
    step = excluded.step, signal = excluded.signal, children = excluded.children
RETURNING until

-- name: wait_end
DELETE FROM job_waits WHERE job_id = :id

-- name: wait_get
SELECT step, signal, children, until FROM job_waits WHERE job_id = :job_id

-- name: signal_list
-- A job's signals, in the order they were sent.
SELECT id, name, payload, sent_at, received_at, step
FROM job_signals WHERE job_id = :job_id ORDER BY id

-- name: wait_lease
-- Whether the attempt's lease still holds the job.
SELECT id FROM jobs WHERE id = :id AND lease_token = :token AND state = 'running'

-- name: children_live
-- How many of the children waited for have not ended yet.
SELECT count(*) FROM jobs
WHERE id IN (SELECT value FROM json_each(:children))
  AND state IN ('waiting', 'queued', 'running')

-- name: children_mark
-- The job waits (step :step) for its children :children until :until (when it
-- looks again), while the attempt's lease holds.
INSERT INTO job_waits (job_id, step, signal, children, until)
SELECT id, :step, NULL, :children, :until FROM jobs
WHERE id = :id AND lease_token = :token AND state = 'running'
ON CONFLICT (job_id) DO UPDATE SET
    until = excluded.until, step = excluded.step, signal = NULL, children = excluded.children
RETURNING until

-- name: sleep_mark
-- The job sleeps (ctx.sleep, step :step) until :until, while the attempt's
-- lease holds: marked as a wait with neither signal nor children, so that the
-- job shows what it waits for and is counted as parked. A mark of the same step
-- keeps its time: a replay after a crash sleeps on, and an operator's wake
-- (wait_wake) ends the sleep. Answers the time the sleep ends.
INSERT INTO job_waits (job_id, step, signal, children, until)
SELECT id, :step, NULL, NULL, :until FROM jobs
WHERE id = :id AND lease_token = :token AND state = 'running'
ON CONFLICT (job_id) DO UPDATE SET
    until = CASE WHEN job_waits.step = excluded.step THEN job_waits.until ELSE excluded.until END,
    step = excluded.step, signal = NULL, children = NULL
RETURNING until

-- name: sleep_end
-- The sleep is over: the job waits no more.
DELETE FROM job_waits WHERE job_id = :id AND until <= :now

-- name: wait_wake
-- An operator wakes a parked job early (queued, not due yet): its wait ends now
-- (a sleep is over, a signal's wait times out, a wait for children looks again).
UPDATE job_waits SET until = :now
WHERE job_id = :job_id AND until > :now
  AND EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND state = 'queued' AND run_at > :now)
RETURNING job_id

-- name: wait_wake_job
UPDATE jobs SET run_at = :now WHERE id = :job_id AND state = 'queued' AND run_at > :now
RETURNING id

-- name: parked_counts
-- Per queue, the jobs parked by a wait: queued for the wait's end, not due yet
-- (a signal or an operator that made one due has woken it).
SELECT jobs.queue, count(*) FROM job_waits JOIN jobs ON jobs.id = job_waits.job_id
WHERE jobs.state = 'queued' AND jobs.run_at > :now
GROUP BY jobs.queue

-- name: cancel_with_children
-- The jobs an operator's cancel of :ids reaches: each queued parent among them
-- parked waiting for its children (ctx.wait) brings its children, and theirs in
-- turn, as the cancel of the parent's own wait cancels them.
WITH RECURSIVE reached(id) AS (
    SELECT CAST(value AS INTEGER) FROM json_each(:ids)
    UNION
    SELECT CAST(child.value AS INTEGER)
    FROM reached
    JOIN jobs parent ON parent.id = reached.id AND parent.state = 'queued'
    JOIN job_waits w ON w.job_id = parent.id AND w.children IS NOT NULL,
    json_each(w.children) AS child
)
SELECT id FROM reached ORDER BY id
