-- The rules and statements that read the same in both SQL dialects, written
-- once. Each dialect's queries.sql starts from this file (its "-- with:" line,
-- see conveyor.store.sql) and adds what differs, such as the clock a rule
-- judges by ({{now}}). Placeholders are :name; PostgreSQL reads them as
-- psycopg's pyformat. No percent sign in this file: psycopg would read it.

-- name: finish_set
-- What a finish sets on a running job for outcome f (a row of its items, fenced
-- by the caller's WHERE): the state it goes to, when it runs again if it is
-- queued again (a rescue or take-back without a time of its own: now), the
-- attempt given back by snooze and release, the result of a success, the
-- error of a failure; the lease is over either way.
state = CASE
        WHEN f.kind = 'complete' THEN 'succeeded'
        WHEN {{finish_requeues}} THEN 'queued'
        WHEN jobs.cancel_requested OR f.kind = 'cancelled' THEN 'cancelled'
        ELSE 'failed' END,
run_at = CASE
        WHEN {{finish_requeues}}
        THEN coalesce(f.run_at, CASE WHEN f.kind IN ('rescue', 'take_back') THEN {{now}} END,
                      jobs.run_at)
        ELSE jobs.run_at END,
finished_at = CASE WHEN {{finish_requeues}} THEN NULL ELSE {{now}} END,
attempts = jobs.attempts - CASE WHEN f.kind IN ('snooze', 'release') THEN 1 ELSE 0 END,
result = CASE WHEN f.kind = 'complete' THEN f.result ELSE jobs.result END,
error = coalesce(f.error, jobs.error),
lease_token = NULL,
lease_expires_at = NULL

-- name: finish_fence
-- Which running job outcome f may end: the one it names, still under the lease
-- it was claimed under (a stale token changes nothing: the fence against a
-- worker that lost its lease); a rescue also needs the lease to have run out
-- (a worker that renewed it meanwhile keeps its job).
jobs.id = f.id
AND jobs.lease_token = f.token
AND jobs.state = 'running'
AND (f.kind <> 'rescue' OR jobs.lease_expires_at < {{now}})

-- name: finish_requeues
-- Whether an outcome f (a row of a finish's items) puts the running job back
-- in the queue: snooze and release always (they give the attempt back), a
-- failed attempt (retry, rescue, take_back) while attempts remain; never a job
-- whose cancel was requested (it ends cancelled, unless it succeeded).
NOT jobs.cancel_requested AND (f.kind IN ('snooze', 'release')
    OR (f.kind IN ('retry', 'rescue', 'take_back') AND jobs.attempts < jobs.max_attempts))

-- name: finish_event_kind
-- The event a finished job's row gets, for outcome f, by the state the job is
-- in now (state) and the event's ordinal: a rescue that did not queue the job
-- again records "rescued" and then (ordinal 2) how the job ended.
CASE WHEN ordinal = 2 THEN state
     WHEN f.kind IN ('rescue', 'take_back') THEN 'rescued'
     WHEN state <> 'queued' THEN state
     WHEN f.kind = 'retry' THEN 'retried'
     WHEN f.kind = 'snooze' THEN 'snoozed'
     ELSE 'released' END

-- name: finish_event
-- The columns of a finished job's event after job_id, in the order of events'
-- (queue, task, kind, attempt, worker, at, error, started_at), from the job's
-- row as the finish left it, outcome f, and the event's ordinal (see
-- finish_event_wanted). Snooze and release gave the attempt back: their event
-- adds one to name the attempt that ran. The first event of a job carries the
-- start of the attempt it ends (a claim writes no event: see event_list).
queue, task, {{finish_event_kind}},
attempts + CASE WHEN f.kind IN ('snooze', 'release') THEN 1 ELSE 0 END,
worker, {{now}},
CASE WHEN f.kind IN ('retry', 'fail', 'rescue', 'take_back') THEN error END,
CASE WHEN ordinal = 1 THEN started_at END

-- name: finish_event_wanted
-- Which ordinals a finished job gets an event for: one event named after what
-- became of it; a rescue that did not queue the job again also records how it
-- ended (ordinal 2), after all the "rescued" events.
ordinal = 1 OR (f.kind IN ('rescue', 'take_back') AND state <> 'queued')

-- name: claimable
-- Whether queued job j may be claimed now: it is due, of the group asked for
-- (if one is), and its group's head: the group's oldest queued job, while no
-- job of the group runs. The unique index jobs_group_running backs this up
-- inside the database: on PostgreSQL these checks read the statement's
-- snapshot, so a claimer that started before another claimer's commit can
-- still see the group idle and pick its next job; the index turns that into a
-- unique violation, and the store claims again with a fresh snapshot. (The
-- CAST gives PostgreSQL the type of a NULL :group.) A job past its deadline
-- (expires=) is passed by; the maintenance sweep ends it (job_expire). A job
-- without one pays a NULL test on the rows the claim takes.
j.state = 'queued'
AND j.run_at <= {{now}}
AND (j.expires_at IS NULL OR j.expires_at > {{now}})
AND (CAST(:group AS TEXT) IS NULL OR j.group_key = :group)
AND (j.group_key IS NULL OR (
    NOT EXISTS (SELECT 1 FROM jobs AS r
                WHERE r.group_key = j.group_key AND r.state = 'running')
    AND NOT EXISTS (SELECT 1 FROM jobs AS o
                    WHERE o.group_key = j.group_key AND o.state = 'queued' AND o.id < j.id)))

-- name: retry_key_rule
-- A manual retry takes keyed job j back only when it is the newest job of its
-- key and no live job holds the key: two retried jobs of one key would both be live.
(j.key IS NULL OR (
    j.id = (SELECT max(o.id) FROM jobs AS o WHERE o.queue = j.queue AND o.key = j.key)
    AND NOT EXISTS (SELECT 1 FROM jobs AS other
                    WHERE other.queue = j.queue AND other.key = j.key
                      AND other.state IN ('queued', 'running'))))

-- name: manual_requeue
-- What a manual retry sets: the job is queued again as new, due now.
state = 'queued',
{{requeue_fresh}}

-- name: requeue_fresh
-- What every manual retry resets, whatever state it puts the job in (a
-- workflow's retry puts a job whose parent runs again in waiting). A deadline
-- to start by (expires=) goes too: running it again is the operator's choice.
attempts = 0,
expires_at = NULL,
run_at = {{now}},
cancel_requested = false,
worker = NULL,
result = NULL,
error = NULL,
progress = NULL,
progress_message = NULL,
started_at = NULL,
finished_at = NULL

-- ---------------------------------------------------------------------------
-- Statements.

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: migration_record
INSERT INTO schema_migrations (version, name, applied_at) VALUES (:version, :name, :now)

-- name: job_get
SELECT * FROM jobs WHERE id = :id

-- name: event_list
-- A job's history, every attempt with its start. Its enqueue is read from the
-- job's row (created_at, seq 0), not from the events: PostgreSQL counts the jobs
-- of an enqueue in one event (migration 023). An attempt's start and worker
-- are stored on the event that ended it (started_at), not as an event of their
-- own, and shown here as a "claimed" event with that event's seq; the running
-- attempt's comes from the job's row, with the seq of the job's last event. A
-- claim is placed (pos) right after the job's last event before it other than
-- a cancel request (the one event an attempt records while it runs) and an
-- enqueue's (shown first, from the row, on both stores). Histories
-- written before started_at existed hold claimed events of their own.
SELECT seq, job_id, queue, task, kind, attempt, worker, at, error FROM (
    SELECT 0 AS seq, 0 AS pos, 0 AS part, id AS job_id, queue, task, 'enqueued' AS kind,
           0 AS attempt, NULL AS worker, created_at AS at, NULL AS error
    FROM jobs WHERE id = :job_id
    UNION ALL
    SELECT seq, seq, 0, job_id, queue, task, kind, attempt, worker, at, error
    FROM events WHERE job_id = :job_id AND kind <> 'enqueued'
    UNION ALL
    SELECT seq,
           coalesce((SELECT max(p.seq) FROM events AS p
                     WHERE p.job_id = :job_id AND p.seq < e.seq
                       AND p.kind NOT IN ('cancel_requested', 'enqueued')), 0),
           1, job_id, queue, task, 'claimed', attempt, worker, started_at, NULL
    FROM events AS e WHERE job_id = :job_id AND started_at IS NOT NULL
    UNION ALL
    SELECT coalesce((SELECT max(p.seq) FROM events AS p WHERE p.job_id = :job_id), 0),
           coalesce((SELECT max(p.seq) FROM events AS p
                     WHERE p.job_id = :job_id AND p.kind NOT IN ('cancel_requested', 'enqueued')), 0),
           1, id, queue, task, 'claimed', attempts, worker, started_at, NULL
    FROM jobs WHERE id = :job_id AND state = 'running'
) AS history
ORDER BY pos, part

-- name: job_progress
UPDATE jobs
SET progress = coalesce(:fraction, progress), progress_message = :message
WHERE id = :id AND lease_token = :token AND state = 'running'

-- name: finished_counts_prune
-- Queues whose finished jobs are all gone leave a zero behind: forget it.
DELETE FROM finished_counts WHERE jobs = 0

-- name: stats_finished_since
SELECT count(*) FROM jobs WHERE finished_at >= :since

-- name: periodic_tick_take
-- Record :tick as the last enqueued tick of periodic task :name, unless it (or
-- a later one) already is: one row comes back when this caller takes the tick.
INSERT INTO periodic_ticks (name, last_tick, updated_at) VALUES (:name, :tick, :now)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE periodic_ticks.last_tick < excluded.last_tick
RETURNING name

-- name: periodic_tick_job
UPDATE periodic_ticks SET job_id = :job_id WHERE name = :name

-- name: periodic_last_ticks
SELECT name, last_tick FROM periodic_ticks

-- name: queue_list
SELECT name, paused FROM queues

-- name: worker_register
INSERT INTO workers (id, host, pid, queues, concurrency, jobs_in_hand, started_at, last_seen_at)
VALUES (:id, :host, :pid, :queues, :concurrency, 0, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at

-- name: worker_beat
-- The check-in answers with what an operator asked of the worker (control: JSON
-- of quiet, stop, concurrency; NULL for nothing): no read of its own.
UPDATE workers SET last_seen_at = :now, jobs_in_hand = :jobs_in_hand WHERE id = :id
RETURNING control

-- name: worker_unregister
DELETE FROM workers WHERE id = :id

-- name: worker_list
SELECT id, host, pid, queues, concurrency, jobs_in_hand, started_at, last_seen_at, control
FROM workers ORDER BY started_at, id

-- name: worker_prune
DELETE FROM workers WHERE last_seen_at < :before

-- name: leader_acquire
-- Take the lease when it is free or expired, or renew it when it is ours.
INSERT INTO leaders (name, holder, expires_at) VALUES (:name, :holder, :expires_at)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leaders.holder = excluded.holder OR leaders.expires_at < :now
RETURNING holder

-- name: leader_release
DELETE FROM leaders WHERE name = :name AND holder = :holder

-- name: queue_names
-- Every queue that has jobs or a pause setting. A loose index scan: each step
-- seeks the next name in jobs_queue_state, so twenty queues cost twenty seeks
-- however many jobs they hold (DISTINCT would read every entry).
WITH RECURSIVE names (name) AS (
    SELECT min(queue) FROM jobs
    UNION ALL
    SELECT (SELECT min(queue) FROM jobs WHERE queue > names.name)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
UNION
SELECT name FROM queues
ORDER BY 1

-- name: batch_counts
SELECT state, count(*) FROM jobs WHERE batch = :batch GROUP BY state

-- name: job_newest_id
-- The newest job's id, from the primary key's end: where a search of arguments starts.
SELECT coalesce(max(id), 0) FROM jobs

-- name: selection_state
-- A selection's state: a stored state, or one of the kinds of queued job (CAST:
-- PostgreSQL cannot type a parameter it meets first in IS NULL).
(CAST(:state AS TEXT) IS NULL OR state = :state OR {{selection_shown}} = :state)

-- name: selection_shown
-- The detailed state a count groups by.
CASE WHEN state <> 'queued' THEN state
            WHEN run_at <= :now THEN 'ready'
            WHEN error IS NOT NULL AND attempts > 0 THEN 'retrying'
            ELSE 'scheduled' END

-- name: job_select
-- A page of the jobs a selection names, newest first from :before_id down. The
-- driver (one of the drive_* blocks, chosen in selection.py) is the condition
-- whose index walks the page.
SELECT * FROM jobs
WHERE {driver}
  AND id < :before_id
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT :limit

-- name: job_count
-- How many jobs a selection names, per detailed state; driven as job_select.
SELECT {{selection_shown}} AS shown, count(*)
FROM jobs
WHERE {driver} AND {{selection_filters}}
GROUP BY shown

-- name: drive_group
-- Walks jobs_group (migration 006).
group_key = :group

-- name: drive_queue
queue = :queue

-- name: drive_queue_state
-- Walks jobs_queue_state for one queue and stored state (:base_state: queued for
-- ready, scheduled and retrying).
queue = :queue AND state = :base_state

-- name: drive_batch
-- Walks jobs_batch, whose entries end in the rowid, so they come in id order.
batch = :batch

-- name: queue_delete
DELETE FROM queues WHERE name = :name

-- name: limit_get
SELECT queue, rate, per, concurrency, key_rate, key_per, key_concurrency, throttled_until
FROM limits WHERE queue = :queue

-- name: limit_prune_throttles
DELETE FROM limit_throttles WHERE until <= :now

-- name: limit_prune_rows
-- Maintenance: queues whose last throttle ended and that have no limit.
DELETE FROM limits
WHERE rate IS NULL AND concurrency IS NULL AND key_rate IS NULL AND key_concurrency IS NULL
  AND (throttled_until IS NULL OR throttled_until <= :now)
  AND NOT EXISTS (SELECT 1 FROM limit_throttles AS t WHERE t.queue = limits.queue)

-- name: job_running_leases
-- The lease of each of these jobs that is running: job_take_back ends them with
-- job_finish (kind take_back), which fences off a late outcome of the holder.
SELECT id, lease_token FROM jobs WHERE {{drive_ids}} AND state = 'running'
