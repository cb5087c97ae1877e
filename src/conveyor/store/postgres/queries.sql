-- Named statements of the PostgreSQL store, side by side with the SQLite ones.
-- ``%(now)s`` is always passed in, never now(), so tests can fix the clock.
--
-- Batches arrive as arrays joined with unnest(): one statement per batch. Each
-- state change appends its events in the same statement (a data-modifying
-- CTE), and sends its notifications there too; PostgreSQL delivers them at
-- commit and folds duplicates within a transaction. Payloads of job ids are
-- comma-separated, 400 ids to a notification (the payload limit is 8000 bytes).
--
-- Array parameters of the batched statements use binary placeholders (``%(x)b``):
-- psycopg dumps a Python list as a text array literal with a regular expression
-- per element, which cost more than the statement on 1,000-job batches.
--
-- Pooled connections run in autocommit: each statement here is a transaction of
-- its own, which is why every change carries its events and notifications.

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL
)

-- name: migrations_lock
-- Held until the transaction ends: concurrent migrators apply each file once.
SELECT pg_advisory_xact_lock(7245018)

-- name: migrations_exist
SELECT to_regclass('schema_migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: migration_record
INSERT INTO schema_migrations (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)

-- name: job_insert
-- One row per input, in input order: (id, inserted). The insert itself, its
-- events and its notification are job_insert_rules (further down this file),
-- shared with every other statement that enqueues. Ids are drawn from the
-- table's sequence in input order, so the caller matches rows to its inputs
-- without reading them back; "inserted" is false for a keyed job that another
-- producer's live job (committed after our key lookup) beat to jobs_live_key.
-- Arrays travel in binary (the "b" placeholders): dumping them as text
-- literals cost more than the insert itself.
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('jobs', 'id'))::regclass) AS id, i.*
    FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(args)b::json[],
                %(kwargs)b::json[], %(priorities)b::integer[], %(run_ats)b::timestamptz[],
                %(max_attempts)b::integer[], %(keys)b::text[], %(groups)b::text[],
                %(batches)b::text[], %(limit_keys)b::text[], %(headers)b::json[])
         WITH ORDINALITY
         AS i(queue, task, args, kwargs, priority, run_at, max_attempts, key, group_key, batch,
              limit_key, headers, ord)
),
{{job_insert_rules}}
SELECT input.id, new.id IS NOT NULL
FROM input LEFT JOIN new ON new.id = input.id CROSS JOIN notified
ORDER BY input.ord

-- name: job_find_keys
-- Every job holding one of the (queue, key) pairs, newest first.
SELECT * FROM jobs
WHERE key IS NOT NULL
  AND (queue, key) IN (SELECT * FROM unnest(%(queues)s::text[], %(keys)s::text[]))
ORDER BY id DESC

-- name: job_get
SELECT * FROM jobs WHERE id = %(id)s

-- name: job_get_many
SELECT * FROM jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_list
SELECT * FROM jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(batch)s::text IS NULL OR batch = %(batch)s)
  AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
  AND id < %(before_id)s
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_claim
-- Each queue is searched on its own (the LATERAL subquery walks one queue's
-- jobs_queued index in claim order and stops at the limit); the best of those
-- candidates win. SKIP LOCKED lets concurrent claimers pass each other.
--
-- A job in a group is claimable only when it is its group's oldest queued job
-- and no job of the group is running. Those checks read this statement's
-- snapshot: a claimer that started before another claimer's commit can still
-- see the group idle and pick its next job. The unique index
-- jobs_group_running turns that into a unique violation, and the store
-- retries the claim with a fresh snapshot.
--
-- A queue with a row in limits (a rate, a concurrency, a throttle) is passed
-- by: job_claim_limited (see the flow control section at the end) claims those.
-- Its plan is several times bigger, and PostgreSQL sets up every part of a plan
-- on each execution, executed or not: it costs a claim of ten jobs about half as
-- much again even when it meets no limit. So the store runs this statement for
-- queues it has not seen limits on, and job_claim_limited for the others. It
-- looks again at least once a second (limit_any), and next_run_in, asked after a
-- claim that took fewer jobs than it could, and job_claim_limited both say
-- whether the queues have limits: a queue passed by is claimed a moment later,
-- never past its limits.
--
-- %(now)s NULL means the server's clock (now()): leases are judged on one
-- clock, whatever the clocks of the worker machines say.
--
-- MATERIALIZED: the locking candidate search must run exactly once.
WITH candidates AS MATERIALIZED (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority FROM jobs AS j
        WHERE j.state = 'queued'
          AND j.queue = q.name
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND (%(group)s::text IS NULL OR j.group_key = %(group)s)
          AND (j.group_key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM jobs AS r
                          WHERE r.group_key = j.group_key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs AS o
                              WHERE o.group_key = j.group_key AND o.state = 'queued'
                                AND o.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    -- Not paused, and no limits (one test: two let the planner check each
    -- candidate job for its queue's pause).
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused
                      UNION ALL
                      SELECT 1 FROM limits AS l WHERE l.queue = q.name)
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE jobs
    SET state = 'running',
        attempts = jobs.attempts + 1,
        worker = %(worker)s,
        lease_token = %(token)s,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
        started_at = coalesce(%(now)s::timestamptz, now()),
        progress = NULL,
        progress_message = NULL
    FROM candidates
    WHERE jobs.id = candidates.id
    RETURNING jobs.*
), claimed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, 'claimed', attempts, worker, coalesce(%(now)s::timestamptz, now()) FROM claimed ORDER BY id
)
SELECT * FROM claimed

-- name: job_heartbeat
UPDATE jobs
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval
FROM unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)
WHERE jobs.id = l.id AND jobs.lease_token = l.token AND jobs.state = 'running'
RETURNING jobs.id, jobs.cancel_requested

-- name: job_finish
-- The one statement that ends running jobs, for every kind of outcome (see
-- FinishKind in store/base.py), with their events and notifications. Each item
-- names the lease it was claimed under, and a stale token changes nothing:
-- that is the fence against a worker that lost its lease. A rescue also needs
-- the lease to have run out (a worker that renewed it meanwhile keeps its
-- job). A job whose cancel was requested ends cancelled, whatever the
-- outcome, unless it succeeded. Snooze and release give the attempt back.
--
-- The new state is decided in the SET expressions from the row being updated,
-- not in a CTE: a cancel committed while this statement waited for the row
-- lock is seen (PostgreSQL re-reads the newest row version there).
WITH changed AS (
    UPDATE jobs
    SET state = CASE
            WHEN f.kind = 'complete' THEN 'succeeded'
            WHEN NOT jobs.cancel_requested AND (f.kind IN ('snooze', 'release')
                 OR (f.kind IN ('retry', 'rescue', 'take_back') AND jobs.attempts < jobs.max_attempts))
            THEN 'queued'
            WHEN jobs.cancel_requested OR f.kind = 'cancelled' THEN 'cancelled'
            ELSE 'failed' END,
        run_at = CASE
            WHEN NOT jobs.cancel_requested AND (f.kind IN ('snooze', 'release')
                 OR (f.kind IN ('retry', 'rescue', 'take_back') AND jobs.attempts < jobs.max_attempts))
            THEN coalesce(f.run_at, CASE WHEN f.kind IN ('rescue', 'take_back') THEN coalesce(%(now)s::timestamptz, now()) END, jobs.run_at)
            ELSE jobs.run_at END,
        finished_at = CASE
            WHEN NOT jobs.cancel_requested AND (f.kind IN ('snooze', 'release')
                 OR (f.kind IN ('retry', 'rescue', 'take_back') AND jobs.attempts < jobs.max_attempts))
            THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
        attempts = jobs.attempts - CASE WHEN f.kind IN ('snooze', 'release') THEN 1 ELSE 0 END,
        result = CASE WHEN f.kind = 'complete' THEN f.result ELSE jobs.result END,
        error = coalesce(f.error, jobs.error),
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)b::bigint[], %(tokens)b::text[], %(kinds)b::text[], %(results)b::json[],
                %(errors)b::text[], %(run_ats)b::timestamptz[])
         AS f(id, token, kind, result, error, run_at)
    WHERE jobs.id = f.id
      AND jobs.lease_token = f.token
      AND jobs.state = 'running'
      AND (f.kind <> 'rescue' OR jobs.lease_expires_at < coalesce(%(now)s::timestamptz, now()))
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker,
              jobs.error, jobs.group_key, f.kind
), changed_events AS (
    -- One event per job, named after what became of it; a rescue that did not
    -- queue the job again also records how it ended, after all the "rescued"
    -- events. Snooze and release gave the attempt back: their events add one.
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
    SELECT id, queue, task,
           CASE WHEN e.ordinal = 2 THEN state
                WHEN changed.kind IN ('rescue', 'take_back') THEN 'rescued'
                WHEN state <> 'queued' THEN state
                WHEN changed.kind = 'retry' THEN 'retried'
                WHEN changed.kind = 'snooze' THEN 'snoozed'
                ELSE 'released' END,
           attempts + CASE WHEN changed.kind IN ('snooze', 'release') THEN 1 ELSE 0 END,
           worker, coalesce(%(now)s::timestamptz, now()),
           CASE WHEN changed.kind IN ('retry', 'fail', 'rescue', 'take_back') THEN error END
    FROM changed
    CROSS JOIN LATERAL (VALUES (1), (2)) AS e(ordinal)
    WHERE e.ordinal = 1 OR (changed.kind IN ('rescue', 'take_back') AND state <> 'queued')
    ORDER BY e.ordinal, id
)
-- Waiters hear of jobs that ended; workers hear of queues with a job queued
-- again, of queues where a group may now let its next job through, and of
-- queues with a concurrency limit (of the queue or of its keys), where a slot
-- was freed: a worker held back by it claims at once.
SELECT changed.id
FROM changed,
     (SELECT count(pg_notify('conveyor_done', d.ids))
      FROM (SELECT string_agg(id::text, ',') AS ids FROM changed
            WHERE state <> 'queued' GROUP BY id / 400) AS d) AS done,
     (SELECT count(pg_notify('conveyor_jobs', q.queue))
      FROM (SELECT DISTINCT queue FROM changed
            WHERE state = 'queued' OR group_key IS NOT NULL
               OR queue IN (SELECT l.queue FROM limits AS l
                            WHERE l.concurrency IS NOT NULL
                               OR l.key_concurrency IS NOT NULL)) AS q) AS ready

-- name: job_progress
UPDATE jobs
SET progress = coalesce(%(fraction)s, progress), progress_message = %(message)s
WHERE id = %(id)s AND lease_token = %(token)s AND state = 'running'

-- name: job_expired_leases
-- Running jobs whose lease ran out (on the server's clock unless %(now)s is
-- given), with the lease they were claimed under: the store ends them with
-- job_finish (kind rescue), which checks both again on the newest row.
SELECT id, lease_token FROM jobs
WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
ORDER BY lease_expires_at, id
LIMIT %(limit)s

-- name: job_purge
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE finished_at < %(before)s AND state IN ('succeeded', 'failed', 'cancelled')
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM doomed) RETURNING queue, kind, xid, seq
), gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING id, queue, state
),
{{finished_counts_forget}}
SELECT count(*) FROM gone

-- name: event_list
SELECT seq, job_id, queue, task, kind, attempt, worker, at, error
FROM events WHERE job_id = %(job_id)s ORDER BY seq

-- name: event_since
SELECT seq, job_id, queue, task, kind, attempt, worker, at, error
FROM events WHERE seq > %(seq)s ORDER BY seq LIMIT %(limit)s

-- name: stats_counts
-- Finished and running jobs per queue and state, without reading the finished
-- ones: finished_counts plus the finishing events after its offset (read first,
-- in the same snapshot: see migration 011), and running jobs from their partial
-- index. The same cost at a thousand finished jobs and at a hundred million.
-- Queued jobs: stats_queued.
SELECT queue, state, sum(n)::bigint FROM (
    SELECT queue, state, jobs AS n FROM finished_counts
    UNION ALL
    SELECT queue, kind, count(*) FROM events
    WHERE (xid, seq) > (%(xid)s::text::xid8, %(seq)s::bigint)
      AND kind IN ('succeeded', 'failed', 'cancelled')
    GROUP BY queue, kind
    UNION ALL
    SELECT queue, 'running', count(*) FROM jobs WHERE state = 'running' GROUP BY queue
) AS counted
GROUP BY queue, state
HAVING sum(n) <> 0

-- name: stats_folded
SELECT xid::text, seq FROM finished_counts_folded

-- name: stats_queued
-- Queued jobs per queue: how many, the oldest due time among those due now, and
-- how many are due later, from jobs_queued alone (it holds run_at).
SELECT queue, count(*), min(run_at) FILTER (WHERE run_at <= %(now)s),
       count(*) FILTER (WHERE run_at > %(now)s)
FROM jobs
WHERE state = 'queued'
GROUP BY queue

-- name: stats_retrying
-- Of the queued jobs due later, those waiting after a failed attempt: the rows
-- of due-later jobs only are read (run_at is checked in the index first).
SELECT queue, count(*) FROM jobs
WHERE state = 'queued' AND run_at > %(now)s AND error IS NOT NULL AND attempts > 0
GROUP BY queue

-- name: finished_counts_lock_fold
-- A fold's lock on the offset; no row when another fold (or a delete) holds it:
-- then this one is skipped (stats are exact without it).
SELECT xid::text, seq FROM finished_counts_folded FOR UPDATE SKIP LOCKED

-- name: finished_counts_fold
-- Add the finishes recorded by the events after the offset to finished_counts,
-- and move the offset past every event counted. As event_count_by_kind, only
-- events of transactions below the oldest one still running, in (xid, seq)
-- order: a transaction that commits a lower seq later is counted then, once.
-- Rows are changed in (queue, state) order, as every writer of them does.
WITH counted AS MATERIALIZED (
    SELECT queue, kind, xid, seq FROM events
    WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
      AND (xid, seq) > (%(xid)s::text::xid8, %(seq)s::bigint)
), added AS (
    INSERT INTO finished_counts (queue, state, jobs)
    SELECT queue, kind, count(*) FROM counted
    WHERE kind IN ('succeeded', 'failed', 'cancelled')
    GROUP BY queue, kind
    ORDER BY queue, kind
    ON CONFLICT (queue, state) DO UPDATE SET jobs = finished_counts.jobs + excluded.jobs
), newest AS (
    SELECT xid, seq FROM counted ORDER BY xid DESC, seq DESC LIMIT 1
)
UPDATE finished_counts_folded SET xid = newest.xid, seq = newest.seq FROM newest

-- name: finished_counts_prune
-- Queues whose finished jobs are all gone leave a zero behind: forget it.
DELETE FROM finished_counts WHERE jobs = 0

-- name: finished_counts_lock
-- A delete's lock on the offset, taken first in its transaction: while it is
-- held no fold moves the offset, so the delete and the folds agree on which of
-- the deleted events were counted already.
SELECT 1 FROM finished_counts_folded FOR UPDATE

-- name: finished_counts_forget
-- Part of every statement that deletes jobs, after CTEs named gone (the jobs
-- deleted: id, queue, state) and gone_events (their events deleted: queue, kind,
-- xid, seq), run with finished_counts_lock held: each finished job deleted is
-- taken off its state's count, and its finishing events that were not yet
-- folded are added (deleted, they never will be: their counts move in now).
forgotten AS (
    INSERT INTO finished_counts (queue, state, jobs)
    SELECT queue, state, sum(n) FROM (
        SELECT queue, state, -1 AS n FROM gone
        WHERE state IN ('succeeded', 'failed', 'cancelled')
        UNION ALL
        SELECT g.queue, g.kind, 1 FROM gone_events AS g, finished_counts_folded AS f
        WHERE g.kind IN ('succeeded', 'failed', 'cancelled') AND (g.xid, g.seq) > (f.xid, f.seq)
    ) AS changes
    GROUP BY queue, state
    ORDER BY queue, state
    ON CONFLICT (queue, state) DO UPDATE SET jobs = finished_counts.jobs + excluded.jobs
)

-- name: finished_counts_retried
-- Part of every manual retry, after a CTE named changed (id, queue, ..., was: the
-- state the job left): those jobs are no longer finished. Rows are changed in
-- (queue, state) order, as every writer of them does.
uncounted AS (
    INSERT INTO finished_counts (queue, state, jobs)
    SELECT queue, was, -count(*) FROM changed
    GROUP BY queue, was
    ORDER BY queue, was
    ON CONFLICT (queue, state) DO UPDATE SET jobs = finished_counts.jobs + excluded.jobs
)

-- name: stats_finished_since
SELECT count(*) FROM jobs WHERE finished_at >= %(since)s

-- name: next_run_in
-- Seconds until the next queued job of the queues that is not due yet becomes
-- due, on the server's clock. Jobs already due are left out: if they were not
-- claimed, a busy group or a pause holds them, and a timer set to their (past)
-- run_at would claim in a loop. The second column says whether any of the
-- queues has limits: the store then asks next_run_in_limited instead (see
-- job_claim for why the two are apart).
SELECT extract(epoch FROM min(run_at) - coalesce(%(now)s::timestamptz, now()))::float8,
       EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))
FROM jobs
WHERE state = 'queued'
  AND run_at > coalesce(%(now)s::timestamptz, now())
  AND queue = ANY(%(queues)s::text[])
  AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = jobs.queue AND p.paused)

-- name: periodic_tick_take
-- Record %(tick)s as the last enqueued tick of periodic task %(name)s, unless it
-- (or a later one) already is: one row comes back when this caller takes the tick.
INSERT INTO periodic_ticks (name, last_tick, updated_at) VALUES (%(name)s, %(tick)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, updated_at = excluded.updated_at
WHERE periodic_ticks.last_tick < excluded.last_tick
RETURNING name

-- name: periodic_tick_job
UPDATE periodic_ticks SET job_id = %(job_id)s WHERE name = %(name)s

-- name: periodic_last_ticks
SELECT name, last_tick FROM periodic_ticks

-- name: queue_set_paused
WITH changed AS (
    INSERT INTO queues (name, paused, updated_at) VALUES (%(name)s, %(paused)s, %(now)s)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at
    RETURNING name, paused
)
SELECT name, CASE WHEN NOT paused THEN pg_notify('conveyor_jobs', name) END FROM changed

-- name: queue_list
SELECT name, paused FROM queues

-- name: worker_register
INSERT INTO workers (id, host, pid, queues, concurrency, jobs_in_hand, started_at, last_seen_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, 0, %(now)s, %(now)s)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at

-- name: worker_beat
UPDATE workers SET last_seen_at = %(now)s, jobs_in_hand = %(jobs_in_hand)s WHERE id = %(id)s

-- name: worker_unregister
DELETE FROM workers WHERE id = %(id)s

-- name: worker_list
SELECT id, host, pid, queues::text, concurrency, jobs_in_hand, started_at, last_seen_at
FROM workers ORDER BY started_at, id

-- name: worker_prune
DELETE FROM workers WHERE last_seen_at < %(before)s

-- name: leader_acquire
-- Take the lease when it is free or expired, or renew it when it is ours.
INSERT INTO leaders (name, holder, expires_at) VALUES (%(name)s, %(holder)s, %(expires_at)s)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leaders.holder = excluded.holder OR leaders.expires_at < %(now)s
RETURNING holder

-- name: leader_release
DELETE FROM leaders WHERE name = %(name)s AND holder = %(holder)s

-- name: job_retry_failed
-- Bulk manual retry: up to %(limit)s failed jobs of %(queue)s (all queues when
-- NULL) that failed at or before %(before)s. The cutoff is the start of the whole
-- operation, so a job that fails again while a long retry runs is not picked up
-- a second time. A keyed job goes back only when it is the newest job of its key
-- and no live job holds the key: two retried jobs of one key would both be live.
WITH picked AS (
    SELECT j.id FROM jobs AS j
    WHERE j.state = 'failed' AND j.finished_at <= %(before)s
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (j.key IS NULL OR (
          j.id = (SELECT max(o.id) FROM jobs AS o WHERE o.queue = j.queue AND o.key = j.key)
          AND NOT EXISTS (
              SELECT 1 FROM jobs AS other
              WHERE other.queue = j.queue AND other.key = j.key
                AND other.state IN ('queued', 'running'))))
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE jobs
    SET state = 'queued',
        attempts = 0,
        run_at = %(now)s,
        cancel_requested = false,
        worker = NULL,
        result = NULL,
        error = NULL,
        progress = NULL,
        progress_message = NULL,
        started_at = NULL,
        finished_at = NULL
    FROM picked
    WHERE jobs.id = picked.id AND jobs.state = 'failed'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.attempts, 'failed'::text AS was
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'manual_retry', attempts, %(now)s FROM changed
),
{{finished_counts_retried}},
notified AS (
    -- One notification per queue, not per job: a batch is a thousand rows.
    SELECT pg_notify('conveyor_jobs', queue) FROM (SELECT DISTINCT queue FROM changed) AS q
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- ---------------------------------------------------------------------------
-- The dashboard and /metrics.

-- name: job_list_by_queue_state
-- job_list when a queue or a state is given: walks jobs_queue_state from the id
-- bound down, so a page costs the same at the first page and the ten-thousandth.
-- A queue without a state runs it once per state, a state without a queue once
-- per queue, and keeps the newest (see job_list_queries). The other filters
-- (and the error text, a substring match) only skip rows.
SELECT * FROM jobs
WHERE queue = %(queue)s
  AND state = %(state)s
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(batch)s::text IS NULL OR batch = %(batch)s)
  AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
  AND id < %(before_id)s
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_list_by_batch
-- job_list when only a batch (and perhaps a task) is given: reads the batch's
-- rows from jobs_batch and sorts them (a batch is bounded by what one fan-out made).
SELECT * FROM jobs
WHERE batch = %(batch)s
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s)) > 0)
  AND id < %(before_id)s
ORDER BY id DESC
LIMIT %(limit)s

-- name: stats_finished_per_slot
-- Jobs that reached a terminal state since since, per queue, state and slot of
-- slot seconds (slot 0 starts at since): the throughput chart. Reads the
-- jobs_finished index range of that hour only.
SELECT queue, state,
       floor(extract(epoch FROM finished_at - %(since)s) / %(slot)s)::int AS slot_index,
       count(*)
FROM jobs
WHERE finished_at >= %(since)s
GROUP BY queue, state, slot_index

-- name: event_count_by_kind
-- Events after the offset (xid, seq) per queue and kind, with the last offset
-- counted: /metrics adds these to its counters and asks again from there,
-- reading only new events. It counts only events of transactions below the
-- oldest one still running (all of which have ended), in (xid, seq) order: a
-- transaction can commit a lower seq after a higher one was counted, and is
-- counted then, once. One statement: one snapshot.
SELECT queue, kind, count(*), max(ARRAY[xid::text::bigint, seq])
FROM events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
  AND (xid, seq) > (%(xid)s::text::xid8, %(seq)s)
GROUP BY queue, kind

-- name: event_offset
-- Ordered by the table's columns (events.xid, not the output column of that
-- name, a bigint): walks events_xid backwards instead of sorting every event.
SELECT xid::text::bigint, seq
FROM events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY events.xid DESC, events.seq DESC
LIMIT 1

-- name: job_run_time_histogram
-- Run time (started_at to finished_at of the last attempt) of the jobs that ended
-- in (after, until], per queue and bucket; bucket i counts run times above
-- bounds[i-1] and at most bounds[i] (Prometheus "le" buckets, not cumulative).
SELECT queue,
       (SELECT count(*) FROM unnest(%(bounds)s::float8[]) AS b WHERE b < d) AS bucket,
       count(*),
       sum(d)
FROM (SELECT queue, extract(epoch FROM finished_at - started_at)::float8 AS d
      FROM jobs
      WHERE finished_at > %(after)s AND finished_at <= %(until)s
        AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL) AS runs
GROUP BY queue, bucket

-- name: plan_for_values
-- For the rest of this transaction, plan each statement for its parameter values.
-- The sessions plan generically (see _session_options), which suits the claim;
-- a job list's best plan depends on the values: a rare queue and state walks
-- jobs_queue_state, a common one may as well walk the primary key.
SET LOCAL plan_cache_mode = force_custom_plan

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
SELECT state, count(*) FROM jobs WHERE batch = %(batch)s GROUP BY state

-- name: job_delete_terminal
-- The archive names the jobs it wrote; only those still terminal and finished
-- before its cutoff go (a job retried since then is live again, or newer).
-- Rows are locked in id order so that two archive runs never deadlock, and a
-- row a manual retry changed meanwhile is checked again after the lock.
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE id = ANY(%(ids)b::bigint[])
      AND state IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < %(before)s
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY id
    FOR UPDATE
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM doomed) RETURNING queue, kind, xid, seq
), gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING id, queue, state
),
{{finished_counts_forget}}
SELECT id FROM gone

-- ---------------------------------------------------------------------------
-- Operating in bulk, groups, retention and the operator's views.
--
-- A selection (JobSelection) filters on every field that is set. Its
-- statements come in variants that differ only in the column that drives the
-- search (ids, a group, a queue and state, a batch, or none), so each can walk
-- an index; the other filters only skip rows (and the store plans them for their
-- values, as job_list, so a filter left NULL drops out of the plan). The
-- "detailed state" tells queued jobs apart: due now is ready; due later after an
-- attempt that left an error is retrying; due later otherwise is scheduled (the
-- same rule as job.detailed_state).

-- name: job_newest_id
-- The newest job's id, from the primary key's end: where a search of arguments starts.
SELECT coalesce(max(id), 0) FROM jobs

-- name: selection_filters
-- The filters of a selection that only skip rows: included by every job_select
-- and job_count statement after its driving condition (which may repeat one of
-- them: a filter that is set twice costs nothing). The text of the arguments is
-- searched only in jobs above args_floor (the newest ones, see selection.py; 0
-- when there is no such search): no index serves a search inside JSON text, and
-- the bound stands apart from the OR so that the primary key's range serves it.
id > %(args_floor)s
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(group)s::text IS NULL OR group_key = %(group)s::text)
  AND (%(batch)s::text IS NULL OR batch = %(batch)s::text)
  AND (%(worker)s::text IS NULL OR worker = %(worker)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
  AND (%(limit_key)s::text IS NULL OR limit_key = %(limit_key)s::text)
  AND (%(error)s::text IS NULL OR strpos(lower(error), lower(%(error)s::text)) > 0)
  AND (%(args)s::text IS NULL OR (strpos(lower(args::text || ' ' || kwargs::text), lower(%(args)s::text)) > 0))

-- name: selection_state
-- A selection's state: a stored state, or one of the kinds of queued job.
(%(state)s::text IS NULL OR state = %(state)s::text
       OR (state = 'queued' AND %(state)s::text = CASE
             WHEN run_at <= %(now)s THEN 'ready'
             WHEN error IS NOT NULL AND attempts > 0 THEN 'retrying'
             ELSE 'scheduled' END))

-- name: selection_shown
-- The detailed state a count groups by.
CASE WHEN state <> 'queued' THEN state
            WHEN run_at <= %(now)s THEN 'ready'
            WHEN error IS NOT NULL AND attempts > 0 THEN 'retrying'
            ELSE 'scheduled' END

-- name: job_select
SELECT * FROM jobs
WHERE id < %(before_id)s
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_select_by_ids
SELECT * FROM jobs
WHERE id = ANY(%(ids)s::bigint[])
  AND id < %(before_id)s
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_select_by_group
-- Walks jobs_group (migration 006) from the id bound down.
SELECT * FROM jobs
WHERE group_key = %(group)s::text
  AND id < %(before_id)s
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_select_by_queue_state
-- Walks jobs_queue_state for one queue and stored state (base_state: queued for
-- ready, scheduled and retrying), as job_list_by_queue_state does.
SELECT * FROM jobs
WHERE queue = %(queue)s::text
  AND state = %(base_state)s::text
  AND id < %(before_id)s
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_select_by_batch
SELECT * FROM jobs
WHERE batch = %(batch)s::text
  AND id < %(before_id)s
  AND {{selection_filters}}
  AND {{selection_state}}
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_count
SELECT {{selection_shown}} AS shown,
       count(*)
FROM jobs
WHERE {{selection_filters}}
GROUP BY shown

-- name: job_count_by_ids
SELECT {{selection_shown}} AS shown,
       count(*)
FROM jobs
WHERE id = ANY(%(ids)s::bigint[])
  AND {{selection_filters}}
GROUP BY shown

-- name: job_count_by_group
SELECT {{selection_shown}} AS shown,
       count(*)
FROM jobs
WHERE group_key = %(group)s::text
  AND {{selection_filters}}
GROUP BY shown

-- name: job_count_by_queue
SELECT {{selection_shown}} AS shown,
       count(*)
FROM jobs
WHERE queue = %(queue)s::text
  AND {{selection_filters}}
GROUP BY shown

-- name: job_count_by_batch
SELECT {{selection_shown}} AS shown,
       count(*)
FROM jobs
WHERE batch = %(batch)s::text
  AND {{selection_filters}}
GROUP BY shown

-- name: job_retry_many
-- Manual retry of the failed or cancelled jobs among ids, with job_retry_failed's
-- rule for keys: only the newest job of a key, and only while no live job holds it.
WITH picked AS (
    SELECT j.id, j.state FROM jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.state IN ('failed', 'cancelled')
      AND (j.key IS NULL OR (
          j.id = (SELECT max(o.id) FROM jobs AS o WHERE o.queue = j.queue AND o.key = j.key)
          AND NOT EXISTS (
              SELECT 1 FROM jobs AS other
              WHERE other.queue = j.queue AND other.key = j.key
                AND other.state IN ('queued', 'running'))))
    ORDER BY j.id
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE jobs
    SET state = 'queued',
        attempts = 0,
        run_at = %(now)s,
        cancel_requested = false,
        worker = NULL,
        result = NULL,
        error = NULL,
        progress = NULL,
        progress_message = NULL,
        started_at = NULL,
        finished_at = NULL
    FROM picked
    WHERE jobs.id = picked.id AND jobs.state IN ('failed', 'cancelled')
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.attempts, picked.state AS was
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'manual_retry', attempts, %(now)s FROM changed ORDER BY id
),
{{finished_counts_retried}},
notified AS (
    SELECT pg_notify('conveyor_jobs', queue) FROM (SELECT DISTINCT queue FROM changed) AS q
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: job_cancel_many
-- Queued: cancelled at once. Running: flagged, and its worker told. Others untouched.
WITH changed AS (
    UPDATE jobs
    SET state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
        finished_at = CASE WHEN state = 'queued' THEN %(now)s ELSE finished_at END,
        cancel_requested = (state = 'running')
    WHERE id = ANY(%(ids)s::bigint[])
      AND (state = 'queued' OR (state = 'running' AND NOT cancel_requested))
    RETURNING id, queue, task, state, attempts, worker
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task,
           CASE state WHEN 'running' THEN 'cancel_requested' ELSE 'cancelled' END,
           attempts, worker, %(now)s
    FROM changed ORDER BY id
)
SELECT changed.id
FROM changed,
     (SELECT count(pg_notify('conveyor_cancel', d.ids))
      FROM (SELECT string_agg(id::text, ',') AS ids FROM changed
            WHERE state = 'running' GROUP BY id / 400) AS d) AS asked,
     (SELECT count(pg_notify('conveyor_done', d.ids))
      FROM (SELECT string_agg(id::text, ',') AS ids FROM changed
            WHERE state = 'cancelled' GROUP BY id / 400) AS d) AS done

-- name: job_delete_many
-- A running job is left alone: its worker holds it (cancel it first). Rows are
-- locked in id order, so two deletes never deadlock.
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state <> 'running'
    ORDER BY id
    FOR UPDATE
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM doomed) RETURNING queue, kind, xid, seq
), gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) AND state <> 'running'
    RETURNING id, queue, state
),
{{finished_counts_forget}}
SELECT id FROM gone

-- name: job_run_now
WITH changed AS (
    UPDATE jobs
    SET run_at = %(now)s
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'queued' AND run_at > %(now)s
    RETURNING id, queue, task, attempts
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'run_now', attempts, %(now)s FROM changed ORDER BY id
), notified AS (
    SELECT pg_notify('conveyor_jobs', queue) FROM (SELECT DISTINCT queue FROM changed) AS q
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: job_running_leases
-- The lease of each of these jobs that is running: job_take_back ends them with
-- job_finish (kind take_back), which fences off a late outcome of the holder.
SELECT id, lease_token FROM jobs WHERE id = ANY(%(ids)s::bigint[]) AND state = 'running'

-- name: job_purge_where
-- Finished jobs of the given states (and queue) that ended before the time,
-- oldest first along jobs_finished.
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE finished_at < %(before)s
      AND state = ANY(%(states)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM doomed) RETURNING queue, kind, xid, seq
), gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING id, queue, state
),
{{finished_counts_forget}}
SELECT count(*) FROM gone

-- name: job_purge_count
SELECT count(*) FROM jobs
WHERE finished_at < %(before)s
  AND state = ANY(%(states)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)

-- name: job_purge_beyond
-- The finished jobs of a queue past its keep newest (by id, the order they were
-- enqueued), up to limit of them. Not locked while chosen (FOR UPDATE would lock
-- the kept rows the offset passes over): the delete checks the state again, and
-- only the jobs it deleted lose their events.
WITH doomed AS MATERIALIZED (
    SELECT id FROM jobs
    WHERE queue = %(queue)s AND state IN ('succeeded', 'failed', 'cancelled')
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
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
{{finished_counts_forget}}
SELECT count(*) FROM gone

-- name: queue_delete
DELETE FROM queues WHERE name = %(name)s

-- The rules of an enqueue: one block, included by every statement that enqueues.

-- name: job_insert_rules
-- What every enqueue does with its rows, given a CTE named input (id, queue, task,
-- args json, kwargs json, priority, run_at timestamptz, max_attempts, key,
-- group_key, batch, limit_key, headers json): job_insert ends with it, and so do
-- the statements of other files that include it (conveyor.store.sql), so a column
-- added here must be added to their input too. A row whose key a live job of its
-- queue holds is not inserted (jobs_live_key; the first row of a key wins); each
-- new job gets its enqueued event; workers of each queue with new jobs are woken
-- at commit. Ends in CTEs named new (the jobs inserted) and notified.
new AS (
    INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                      key, group_key, batch, created_at, limit_key, headers)
    SELECT id, queue, task, args, kwargs, priority, run_at, max_attempts,
           key, group_key, batch, %(now)s, limit_key, headers
    FROM input
    -- Keys in one global order: two producers inserting the same keys wait for
    -- each other's uncommitted rows in the same order, so they never deadlock.
    ORDER BY queue, key, id
    ON CONFLICT (queue, key) WHERE key IS NOT NULL AND state IN ('queued', 'running') DO NOTHING
    RETURNING id, queue, task, created_at
), enqueued AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'enqueued', 0, created_at FROM new ORDER BY id
), notified AS (
    SELECT count(pg_notify('conveyor_jobs', q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM new) AS q
)

-- ---------------------------------------------------------------------------
-- Flow control: rate and concurrency limits per queue and per limit key.
--
-- job_claim_limited enforces them (its comment says how a claim knows its
-- counts are current); next_run_in_limited says when a held-back queue lets the
-- next job through; job_finish notifies the workers of a queue whose
-- concurrency slot it freed. The store uses the two *_limited statements for
-- queues that have limits, as the plain ones tell it (see job_claim).
-- Usage: a concurrency counts the running jobs (of the queue, or of the key); a
-- rate counts the rows of limit_starts in its window; a throttle is a moment
-- (limits.throttled_until for the queue, limit_throttles for a key).

-- name: job_claim_limited
-- job_claim, for queues of which some have limits: the same search for the
-- queues without, and for a limited queue a search of its own that starts only
-- as many jobs as its limits leave room for.
--
-- A limited queue may start only as many jobs as its throttle, concurrency and
-- rate leave room for; a job with a limit key is claimable only when it is one
-- of its key's oldest ready jobs, as many as its key has room for (the rooms of
-- the keys in use are read once, as a JSON map). Room is counted from running
-- jobs and from limit_starts, which this statement's snapshot may show as they
-- were before another claim of the queue committed. So a claim of a limited
-- queue first locks the queue's limits row (SKIP LOCKED: one claim of a queue at
-- a time; the others pass it by) and compares the version it locked, the
-- newest, with the version its snapshot reads: every claim that starts jobs of
-- the queue bumps it, so equal versions mean the counts are current. A queue
-- whose row was locked or had changed is left for the next claim (next_run_in
-- then answers "now").
--
-- %(now)s NULL means the server's clock (now()): leases are judged on one
-- clock, whatever the clocks of the worker machines say.
--
-- MATERIALIZED: the locking searches must run exactly once.
WITH lim AS MATERIALIZED (
    SELECT l.* FROM limits AS l
    WHERE l.queue = ANY(%(queues)s::text[])
    ORDER BY l.queue
    FOR UPDATE SKIP LOCKED
), allowed AS MATERIALIZED (
    SELECT lim.queue, lim.rate, lim.per, lim.key_rate, lim.key_per, lim.key_concurrency,
           least(%(limit)s,
                 CASE WHEN lim.throttled_until > coalesce(%(now)s::timestamptz, now()) THEN 0 END,
                 lim.concurrency - (SELECT count(*) FROM jobs AS r
                                    WHERE r.queue = lim.queue AND r.state = 'running'),
                 lim.rate - (SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
                             WHERE s.queue = lim.queue
                               AND s.at > coalesce(%(now)s::timestamptz, now())
                                          - make_interval(secs => lim.per)))::integer AS allow,
           -- The room of each limit key in use (running, started in the key rate's
           -- window, or throttled), read once per claim: {"customer-42": 0, ...}.
           -- A key not in it has all its room.
           (SELECT jsonb_object_agg(k.limit_key, k.room) FROM (
                SELECT u.limit_key,
                       least(CASE WHEN bool_or(u.throttled) THEN 0 END,
                             lim.key_concurrency - sum(u.running),
                             lim.key_rate - sum(u.started)) AS room
                FROM (
                    SELECT r.limit_key, 1 AS running, 0 AS started, false AS throttled
                    FROM jobs AS r
                    WHERE r.queue = lim.queue AND r.state = 'running'
                      AND r.limit_key IS NOT NULL
                    UNION ALL
                    SELECT s.limit_key, 0, s.jobs, false FROM limit_starts AS s
                    WHERE s.queue = lim.queue AND s.limit_key IS NOT NULL
                      AND s.at > coalesce(%(now)s::timestamptz, now())
                                 - make_interval(secs => lim.key_per)
                    UNION ALL
                    SELECT t.limit_key, 0, 0, true FROM limit_throttles AS t
                    WHERE t.queue = lim.queue
                      AND t.until > coalesce(%(now)s::timestamptz, now())
                ) AS u
                GROUP BY u.limit_key
            ) AS k) AS key_rooms
    FROM lim
    JOIN limits AS seen ON seen.queue = lim.queue AND seen.version = lim.version
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = lim.queue AND p.paused)
), plain AS MATERIALIZED (
    -- The queues without limits, searched as job_claim does.
    SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused)
      AND NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.queue = q.name)
), candidates AS MATERIALIZED (
    SELECT both_kinds.id FROM (
        SELECT c.id, c.priority
        FROM plain AS q
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority FROM jobs AS j
            WHERE j.state = 'queued'
              AND j.queue = q.name
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND (%(group)s::text IS NULL OR j.group_key = %(group)s)
              AND (j.group_key IS NULL OR (
                  NOT EXISTS (SELECT 1 FROM jobs AS r
                              WHERE r.group_key = j.group_key AND r.state = 'running')
                  AND NOT EXISTS (SELECT 1 FROM jobs AS o
                                  WHERE o.group_key = j.group_key AND o.state = 'queued'
                                    AND o.id < j.id)))
            ORDER BY j.priority DESC, j.id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS c
        UNION ALL
        -- Limited queues: the queue's room, each key within its own (the rule of
        -- a key's oldest ready jobs below).
        SELECT c.id, c.priority
        FROM allowed AS a
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority FROM jobs AS j
            CROSS JOIN LATERAL (
                SELECT CASE WHEN j.limit_key IS NOT NULL
                            THEN coalesce((a.key_rooms ->> j.limit_key)::bigint,
                                          least(a.key_concurrency, a.key_rate))
                       END AS key_room
                OFFSET 0  -- computed once per job (inlined, it ran once per use)
            ) AS kr
            WHERE j.state = 'queued'
              AND j.queue = a.queue
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND (%(group)s::text IS NULL OR j.group_key = %(group)s)
              AND (j.group_key IS NULL OR (
                  NOT EXISTS (SELECT 1 FROM jobs AS r
                              WHERE r.group_key = j.group_key AND r.state = 'running')
                  AND NOT EXISTS (SELECT 1 FROM jobs AS o
                                  WHERE o.group_key = j.group_key AND o.state = 'queued'
                                    AND o.id < j.id)))
              -- Only a key's oldest ready jobs, as many as it has room for: a
              -- key with a long backlog is passed over, like a busy group.
              AND (kr.key_room IS NULL OR (
                  kr.key_room > 0
                  AND (SELECT count(*) FROM (
                          SELECT 1 FROM jobs AS o
                          WHERE o.queue = j.queue AND o.limit_key = j.limit_key
                            AND o.state = 'queued' AND o.id < j.id
                            AND o.run_at <= coalesce(%(now)s::timestamptz, now())
                          LIMIT kr.key_room) AS older) < kr.key_room))
            ORDER BY j.priority DESC, j.id
            LIMIT a.allow
            FOR UPDATE OF j SKIP LOCKED
        ) AS c
        WHERE a.allow > 0
    ) AS both_kinds
    ORDER BY both_kinds.priority DESC, both_kinds.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE jobs
    SET state = 'running',
        attempts = jobs.attempts + 1,
        worker = %(worker)s,
        lease_token = %(token)s,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
        started_at = coalesce(%(now)s::timestamptz, now()),
        progress = NULL,
        progress_message = NULL
    -- An array, so that the update finds its rows by primary key (from a join
    -- with this plan's candidates, the planner chose to hash the whole table).
    WHERE jobs.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING jobs.*
), claimed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, 'claimed', attempts, worker, coalesce(%(now)s::timestamptz, now()) FROM claimed ORDER BY id
), started AS (
    -- The starts of this claim, for the rates that count them: one row per queue
    -- and limit key, with the number of its jobs this claim started.
    INSERT INTO limit_starts (queue, limit_key, at, jobs)
    SELECT c.queue, c.limit_key, coalesce(%(now)s::timestamptz, now()), count(*)
    FROM claimed AS c JOIN allowed AS a ON a.queue = c.queue
    WHERE a.rate IS NOT NULL OR a.key_rate IS NOT NULL
    GROUP BY c.queue, c.limit_key
), expired AS (
    -- Starts that left every window of their queue, with %(slack)s seconds to
    -- spare for clocks that step back.
    DELETE FROM limit_starts AS s
    USING allowed AS a
    WHERE s.queue = a.queue
      AND s.at < coalesce(%(now)s::timestamptz, now())
                 - make_interval(secs => %(slack)s::float8 + greatest(a.per, a.key_per))
), bumped AS (
    UPDATE limits SET version = limits.version + 1
    WHERE limits.queue IN (SELECT a.queue FROM allowed AS a)
      AND limits.queue IN (SELECT c.queue FROM claimed AS c)
)
-- As job_claim: a last column saying whether any of the queues has limits.
SELECT claimed.*, seen.limited
FROM (SELECT EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[])) AS limited)
     AS seen
LEFT JOIN claimed ON true

-- name: next_run_in_limited
-- next_run_in, for queues of which some have limits. Seconds until a claim on
-- the queues could start a job that it cannot now, on the server's clock: when the next queued job that is not due yet becomes
-- due, or, for a queue with limits, when a throttle ends or a full rate window lets the next job through. 0 when a
-- limited queue would let a ready job through already (a claim that ran while
-- another held the limit took none). Jobs already due are otherwise left out:
-- if they were not claimed, a busy group, a pause or a full concurrency limit
-- holds them, a timer set to their (past) run_at would claim in a loop, and
-- what frees them (a job that ends, a resume) notifies the workers. A spent
-- moment (a window that slides while no job waits) costs one empty claim,
-- never a loop.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), asked AS (
    SELECT q.name AS queue FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused)
), lim AS (
    SELECT l.*,
           least(CASE WHEN l.throttled_until > clock.now THEN 0 ELSE 1 END,
                 l.concurrency - (SELECT count(*) FROM jobs AS r
                                  WHERE r.queue = l.queue AND r.state = 'running'),
                 l.rate - (SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
                           WHERE s.queue = l.queue
                             AND s.at > clock.now - make_interval(secs => l.per))) AS allow
    FROM limits AS l, clock
    WHERE l.queue IN (SELECT queue FROM asked)
), open_lim AS (
    -- While a queue's throttle lasts, its end is the only moment that counts.
    SELECT lim.* FROM lim, clock
    WHERE lim.throttled_until IS NULL OR lim.throttled_until <= clock.now
), moments (at) AS (
    SELECT min(run_at) FROM jobs, clock
    WHERE state = 'queued'
      AND run_at > clock.now
      AND queue IN (SELECT queue FROM asked)
    UNION ALL
    -- A ready job a claim would take now: job_claim_limited's tests, job by job.
    SELECT clock.now FROM lim AS a, clock
    WHERE a.allow > 0
      AND EXISTS (
          SELECT 1 FROM jobs AS j
          WHERE j.state = 'queued'
            AND j.queue = a.queue
            AND j.run_at <= clock.now
            AND (%(group)s::text IS NULL OR j.group_key = %(group)s)
            AND (j.group_key IS NULL OR (
                NOT EXISTS (SELECT 1 FROM jobs AS r
                            WHERE r.group_key = j.group_key AND r.state = 'running')
                AND NOT EXISTS (SELECT 1 FROM jobs AS o
                                WHERE o.group_key = j.group_key AND o.state = 'queued'
                                  AND o.id < j.id)))
            AND (j.limit_key IS NULL OR (
                NOT EXISTS (SELECT 1 FROM limit_throttles AS t
                            WHERE t.queue = j.queue AND t.limit_key = j.limit_key
                              AND t.until > clock.now)
                AND (a.key_concurrency IS NULL
                     OR (SELECT count(*) FROM jobs AS r
                         WHERE r.queue = j.queue AND r.limit_key = j.limit_key
                           AND r.state = 'running') < a.key_concurrency)
                AND (a.key_rate IS NULL
                     OR (SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
                         WHERE s.queue = j.queue AND s.limit_key = j.limit_key
                           AND s.at > clock.now - make_interval(secs => a.key_per))
                        < a.key_rate)
                AND NOT EXISTS (SELECT 1 FROM jobs AS o
                                WHERE o.queue = j.queue AND o.limit_key = j.limit_key
                                  AND o.state = 'queued' AND o.id < j.id
                                  AND o.run_at <= clock.now))))
    UNION ALL
    SELECT lim.throttled_until FROM lim, clock WHERE lim.throttled_until > clock.now
    UNION ALL
    SELECT t.until FROM limit_throttles AS t JOIN open_lim AS lim ON lim.queue = t.queue, clock
    WHERE t.until > clock.now
    UNION ALL
    -- A full window lets one more job start when the start that filled it leaves
    -- it: counting back from the newest, the row whose jobs reach the rate.
    SELECT w.at + make_interval(secs => w.per) FROM (
        SELECT s.at, s.jobs, lim.per, lim.rate,
               sum(s.jobs) OVER (PARTITION BY s.queue ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue, clock
        WHERE lim.rate IS NOT NULL AND s.at > clock.now - make_interval(secs => lim.per)
    ) AS w
    WHERE w.newer >= w.rate AND w.newer - w.jobs < w.rate
    UNION ALL
    SELECT w.at + make_interval(secs => w.key_per) FROM (
        SELECT s.at, s.jobs, lim.key_per, lim.key_rate,
               sum(s.jobs) OVER (PARTITION BY s.queue, s.limit_key ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue, clock
        WHERE lim.key_rate IS NOT NULL AND s.limit_key IS NOT NULL
          AND s.at > clock.now - make_interval(secs => lim.key_per)
    ) AS w
    WHERE w.newer >= w.key_rate AND w.newer - w.jobs < w.key_rate
)
SELECT extract(epoch FROM min(moments.at) - clock.now)::float8,
       EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))
FROM moments, clock
GROUP BY clock.now

-- name: limit_any
SELECT EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))

-- name: limit_set
-- Set the limit of one scope ('queue' or 'key') of a queue; the other scope's
-- stays. Workers waiting on the queue hear of it (a limit raised lets them claim).
WITH changed AS (
    INSERT INTO limits (queue, rate, per, concurrency, key_rate, key_per, key_concurrency,
                        updated_at)
    VALUES (%(queue)s,
            CASE WHEN %(scope)s = 'queue' THEN %(rate)s::integer END,
            CASE WHEN %(scope)s = 'queue' THEN %(per)s::float8 END,
            CASE WHEN %(scope)s = 'queue' THEN %(concurrency)s::integer END,
            CASE WHEN %(scope)s = 'key' THEN %(rate)s::integer END,
            CASE WHEN %(scope)s = 'key' THEN %(per)s::float8 END,
            CASE WHEN %(scope)s = 'key' THEN %(concurrency)s::integer END,
            %(now)s)
    ON CONFLICT (queue) DO UPDATE SET
        rate = CASE WHEN %(scope)s = 'queue' THEN excluded.rate ELSE limits.rate END,
        per = CASE WHEN %(scope)s = 'queue' THEN excluded.per ELSE limits.per END,
        concurrency = CASE WHEN %(scope)s = 'queue' THEN excluded.concurrency
                           ELSE limits.concurrency END,
        key_rate = CASE WHEN %(scope)s = 'key' THEN excluded.key_rate ELSE limits.key_rate END,
        key_per = CASE WHEN %(scope)s = 'key' THEN excluded.key_per ELSE limits.key_per END,
        key_concurrency = CASE WHEN %(scope)s = 'key' THEN excluded.key_concurrency
                               ELSE limits.key_concurrency END,
        version = limits.version + 1,
        updated_at = excluded.updated_at
    RETURNING queue
)
SELECT pg_notify('conveyor_jobs', queue) FROM changed

-- name: limit_forget_empty
-- A queue left with no limit and no throttle goes back to the plain claim.
DELETE FROM limits
WHERE queue = %(queue)s
  AND rate IS NULL AND concurrency IS NULL AND key_rate IS NULL AND key_concurrency IS NULL
  AND (throttled_until IS NULL OR throttled_until <= coalesce(%(now)s::timestamptz, now()))
  AND NOT EXISTS (SELECT 1 FROM limit_throttles AS t
                  WHERE t.queue = %(queue)s AND t.until > coalesce(%(now)s::timestamptz, now()))

-- name: limit_throttle_queue
-- Hold the whole queue back for %(seconds)s (a throttle is never shortened by another).
INSERT INTO limits (queue, throttled_until, updated_at)
VALUES (%(queue)s,
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(seconds)s::float8),
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (queue) DO UPDATE SET
    throttled_until = greatest(limits.throttled_until, excluded.throttled_until),
    version = limits.version + 1,
    updated_at = excluded.updated_at
RETURNING throttled_until

-- name: limit_throttle_key
-- Hold one key of the queue back; the queue gets a limits row (if it had none),
-- so that its claims look at key throttles.
WITH queue_row AS (
    INSERT INTO limits (queue, updated_at)
    VALUES (%(queue)s, coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (queue) DO NOTHING
)
INSERT INTO limit_throttles (queue, limit_key, until)
VALUES (%(queue)s, %(key)s,
        coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(seconds)s::float8))
ON CONFLICT (queue, limit_key) DO UPDATE SET until = greatest(limit_throttles.until, excluded.until)
RETURNING until

-- name: limit_lift_queue
WITH lifted AS (
    UPDATE limits SET throttled_until = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
    WHERE queue = %(queue)s
    RETURNING queue
)
SELECT coalesce(%(now)s::timestamptz, now()), pg_notify('conveyor_jobs', %(queue)s)

-- name: limit_lift_key
WITH lifted AS (
    DELETE FROM limit_throttles WHERE queue = %(queue)s AND limit_key = %(key)s
)
SELECT coalesce(%(now)s::timestamptz, now()), pg_notify('conveyor_jobs', %(queue)s)

-- name: limit_get
SELECT queue, rate, per, concurrency, key_rate, key_per, key_concurrency, throttled_until
FROM limits WHERE queue = %(queue)s

-- name: limit_usage
-- Every limit and how full it is: running jobs, starts in the queue rate's
-- window, ready jobs, and of the keys with ready jobs those that are held back
-- (no room left: throttled, or at their rate or concurrency) and the ready
-- jobs beyond their keys' room. Reads every ready job with a limit key of a
-- limited queue: a view for operators, not a path of the claim.
WITH per_key AS (
    -- Grouped by the limits row's key, so its columns may be read as they are.
    SELECT l.queue, j.limit_key, count(*) AS ready, least(
        CASE WHEN EXISTS (SELECT 1 FROM limit_throttles AS t
                          WHERE t.queue = l.queue AND t.limit_key = j.limit_key
                            AND t.until > %(now)s) THEN 0 END,
        l.key_concurrency - (SELECT count(*) FROM jobs AS r
                             WHERE r.queue = l.queue AND r.limit_key = j.limit_key
                               AND r.state = 'running'),
        l.key_rate - (SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
                      WHERE s.queue = l.queue AND s.limit_key = j.limit_key
                        AND s.at > %(now)s - make_interval(secs => l.key_per))
    ) AS room
    FROM jobs AS j JOIN limits AS l ON l.queue = j.queue
    WHERE j.limit_key IS NOT NULL AND j.state = 'queued' AND j.run_at <= %(now)s
    GROUP BY l.queue, j.limit_key
)
SELECT l.queue, l.rate, l.per, l.concurrency, l.key_rate, l.key_per, l.key_concurrency,
       l.throttled_until,
       (SELECT count(*) FROM jobs AS r WHERE r.queue = l.queue AND r.state = 'running'),
       CASE WHEN l.rate IS NULL THEN 0 ELSE (
           SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
           WHERE s.queue = l.queue AND s.at > %(now)s - make_interval(secs => l.per))
       END,
       (SELECT count(*) FROM jobs AS q
        WHERE q.queue = l.queue AND q.state = 'queued' AND q.run_at <= %(now)s),
       (SELECT count(*) FROM per_key AS k WHERE k.queue = l.queue AND k.room <= 0),
       -- room NULL: the key has no limit of its own (greatest() would read NULL as 0).
       (SELECT coalesce(sum(CASE WHEN k.room IS NULL THEN 0
                                 ELSE greatest(k.ready - greatest(k.room, 0), 0) END), 0)
        FROM per_key AS k
        WHERE k.queue = l.queue),
       (SELECT count(*) FROM limit_throttles AS t WHERE t.queue = l.queue AND t.until > %(now)s)
FROM limits AS l
ORDER BY l.queue

-- name: limit_prune_all_starts
-- Maintenance: starts that left every window of their queue (or whose queue has
-- no rate any more), with %(slack)s seconds to spare.
DELETE FROM limit_starts
WHERE at < %(now)s - make_interval(secs => %(slack)s::float8 + coalesce(
          (SELECT greatest(l.per, l.key_per) FROM limits AS l WHERE l.queue = limit_starts.queue),
          0))

-- name: limit_prune_throttles
DELETE FROM limit_throttles WHERE until <= %(now)s

-- name: limit_prune_rows
-- Maintenance: queues whose last throttle ended and that have no limit.
DELETE FROM limits
WHERE rate IS NULL AND concurrency IS NULL AND key_rate IS NULL AND key_concurrency IS NULL
  AND (throttled_until IS NULL OR throttled_until <= %(now)s)
  AND NOT EXISTS (SELECT 1 FROM limit_throttles AS t WHERE t.queue = limits.queue)
