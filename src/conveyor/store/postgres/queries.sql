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

-- with: conveyor.store/shared.sql as pyformat

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

-- name: job_get_many
SELECT * FROM jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_claim
-- Each queue is searched on its own (claim_search walks one queue's jobs_queued
-- index in claim order and stops at the limit); the best of those candidates
-- win. SKIP LOCKED lets concurrent claimers pass each other.
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
-- MATERIALIZED: the locking candidate search must run exactly once.
WITH candidates AS MATERIALIZED (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL ({{claim_search}} LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS c
    -- Not paused, and no limits (one test: two let the planner check each
    -- candidate job for its queue's pause).
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused
                      UNION ALL
                      SELECT 1 FROM limits AS l WHERE l.queue = q.name)
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s
),
{{claim_apply}}
SELECT claimed.*, NULL::float8, NULL::boolean FROM claimed
-- A claim that took fewer jobs than it could also answers next_run_in (the
-- question its worker asks next), in a row of its own: a row of NULLs for the
-- job, then next_due's two columns. A lone job so costs one statement less.
UNION ALL
SELECT (NULL::jobs).*, due.* FROM ({{next_due}}) AS due
WHERE (SELECT count(*) FROM claimed) < %(limit)s

-- name: now
-- The moment a statement judges by: %(now)s, or the server's clock when it is
-- NULL, so that leases are judged on one clock whatever the clocks of the
-- worker machines say.
coalesce(%(now)s::timestamptz, now())

-- name: claim_search
-- The claimable jobs of queue q.name in claim order (the caller limits and locks).
SELECT j.id, j.priority FROM jobs AS j
WHERE j.queue = q.name AND {{claimable}}
ORDER BY j.priority DESC, j.id

-- name: claim_apply
-- After a CTE named candidates (the ids a claim chose, locked): start them under
-- the claim's lease. Ends in a CTE named claimed. No event: the attempt's start
-- and worker are written with the event that ends it (see event_list).
claimed AS (
    UPDATE jobs
    SET state = 'running',
        attempts = jobs.attempts + 1,
        worker = %(worker)s,
        lease_token = %(token)s,
        lease_expires_at = {{now}} + %(lease)s::interval,
        started_at = {{now}},
        progress = NULL,
        progress_message = NULL
    -- An array, so that the update finds its rows by primary key (from a join
    -- with job_claim_limited's candidates, the planner chose to hash the whole table).
    WHERE jobs.id = ANY(ARRAY(SELECT id FROM candidates))
    RETURNING jobs.*
)

-- name: job_heartbeat
-- Extend the leases that still hold, without waiting for any row: the rows are
-- locked first, in id order as job_finish locks them (the two never deadlock),
-- and a row another transaction holds (a handler's ctx.complete not yet
-- committed, a rescue, a cancel) is passed over. Such a row is answered as busy
-- (last column) when the last commit still shows it running under its lease:
-- not renewed this time, and not lost either; the worker tries it again soon.
WITH l AS (
    SELECT * FROM unnest(%(ids)b::bigint[], %(tokens)b::text[]) AS l(id, token)
), locked AS MATERIALIZED (
    SELECT jobs.id FROM jobs JOIN l ON jobs.id = l.id
    -- The array as well: the rows found by primary key, however many run.
    WHERE jobs.id = ANY(%(ids)b::bigint[])
      AND jobs.lease_token = l.token AND jobs.state = 'running'
    ORDER BY jobs.id
    FOR UPDATE OF jobs SKIP LOCKED
), renewed AS (
    UPDATE jobs
    SET lease_expires_at = {{now}} + %(lease)s::interval
    WHERE jobs.id = ANY(ARRAY(SELECT id FROM locked))
    RETURNING jobs.id, jobs.cancel_requested
)
SELECT id, cancel_requested, false FROM renewed
UNION ALL
-- Looked for only when some lease was not locked (a one-time filter): a renewal
-- that locked them all reads no more.
SELECT jobs.id, jobs.cancel_requested, true FROM jobs JOIN l ON jobs.id = l.id
WHERE (SELECT count(*) FROM locked) < cardinality(%(ids)b::bigint[])
  AND jobs.lease_token = l.token AND jobs.state = 'running'
  AND jobs.id <> ALL(ARRAY(SELECT id FROM locked))

-- name: job_finish
-- The one statement that ends running jobs, for every kind of outcome (see
-- FinishKind in store/base.py), with their events and notifications. It waits
-- for no row: a row another transaction holds (a handler's ctx.complete not yet
-- committed, a renewal, a cancel, a claim that locked it and let it go) is
-- passed over and left as it is, and answered apart (the last column false):
-- the store tries those again a few times at once, for the moments a statement
-- holds a row, and then leaves them to its caller (the worker's completer
-- finishes them again later, the next rescue round tries them again). Rows are
-- locked in id order, as job_heartbeat locks them, so the two never deadlock.
--
-- Run with %(flows)s false, alone (no transaction around it), it passes by
-- jobs that others wait for (waited_on) and answers nothing for them: the
-- store finishes those again with %(flows)s true in a transaction that
-- resolves their edges (workflows.sql). A job nothing waits for so costs one
-- statement. The flag is on the row, not read from job_edges, because of one
-- race: an enqueue that names this job as a parent sets waited_on, and a
-- finish that locks the row after that enqueue committed re-checks its WHERE
-- on the newest row version, while anything else this statement read
-- (job_edges) is from the snapshot it started with, before the new edge.
WITH locked AS MATERIALIZED (
    {{finish_lock}} SKIP LOCKED
),
{{finish_apply}}

-- name: job_complete_in
-- ctx.complete: job_finish of one success, in the caller's transaction, which
-- waits for the row: a renewal or a rescue holding it a moment (they never wait
-- themselves) must not turn a success into a lost lease.
WITH locked AS MATERIALIZED (
    {{finish_lock}}
),
{{finish_apply}}

-- name: finish_lock
-- The rows a finish may end (finish_fence, in shared.sql), locked in id order;
-- job_finish adds SKIP LOCKED.
SELECT jobs.id FROM jobs
JOIN unnest(%(ids)b::bigint[], %(tokens)b::text[], %(kinds)b::text[]) AS f(id, token, kind)
  ON jobs.id = f.id
-- The array as well: the rows found by primary key, however many run.
WHERE jobs.id = ANY(%(ids)b::bigint[]) AND {{finish_fence}}
ORDER BY jobs.id
FOR UPDATE OF jobs

-- name: finish_apply
-- After a CTE named locked (the rows a finish holds): end them, which is what
-- finish_set says, with their events and notifications. The new state is
-- decided in the SET expressions from the row being updated, not in a CTE: a
-- cancel committed before the row was locked is seen (PostgreSQL re-reads the
-- newest row version there).
changed AS (
    UPDATE jobs
    SET {{finish_set}}
    FROM unnest(%(ids)b::bigint[], %(tokens)b::text[], %(kinds)b::text[], %(results)b::json[],
                %(errors)b::text[], %(run_ats)b::timestamptz[])
         AS f(id, token, kind, result, error, run_at)
    WHERE jobs.id = ANY(ARRAY(SELECT id FROM locked)) AND {{finish_fence}}
      AND (%(flows)s OR NOT jobs.waited_on)
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker,
              jobs.error, jobs.group_key, jobs.started_at, f.kind
), changed_events AS (
    -- The events of the jobs ended (finish_event in shared.sql).
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error, started_at)
    SELECT id, {{finish_event}}
    FROM changed AS f
    CROSS JOIN LATERAL (VALUES (1), (2)) AS e(ordinal)
    WHERE {{finish_event_wanted}}
    ORDER BY e.ordinal, id
), ended AS (
    SELECT id FROM changed WHERE state <> 'queued'
), passed AS (
    -- The rows passed over: held by another transaction, and shown by the last
    -- commit as the finish may end them. Looked for only when some row was not
    -- locked (a one-time filter), so a finish that locked them all reads no more.
    SELECT jobs.id FROM jobs
    JOIN unnest(%(ids)b::bigint[], %(tokens)b::text[], %(kinds)b::text[]) AS f(id, token, kind)
      ON jobs.id = f.id
    WHERE (SELECT count(*) FROM locked) < cardinality(%(ids)b::bigint[])
      AND {{finish_fence}}
      AND jobs.id <> ALL(ARRAY(SELECT id FROM locked))
)
-- Waiters hear of jobs that ended; workers hear of queues with a job queued
-- again, of queues where a group may now let its next job through, and of
-- queues with a concurrency limit (of the queue or of its keys), where a slot
-- was freed: a worker held back by it claims at once. The last column says
-- which rows were changed (true) and which passed over (false).
SELECT changed.id, true
FROM changed,
     ({{notify_done}}) AS done,
     (SELECT count(pg_notify('conveyor_jobs', q.queue))
      FROM (SELECT DISTINCT queue FROM changed
            WHERE state = 'queued' OR group_key IS NOT NULL
               OR queue IN (SELECT l.queue FROM limits AS l
                            WHERE l.concurrency IS NOT NULL
                               OR l.key_concurrency IS NOT NULL)) AS q) AS ready
UNION ALL
SELECT id, false FROM passed

-- name: notify_done
-- Tells waiters that the jobs of a CTE named ended (id) ended, 400 ids to a
-- notification (the payload limit is 8000 bytes).
SELECT count(pg_notify('conveyor_done', d.ids))
FROM (SELECT string_agg(id::text, ',') AS ids FROM ended GROUP BY id / 400) AS d

-- name: job_expired_leases
-- Running jobs whose lease ran out (on the server's clock unless %(now)s is
-- given), with the lease they were claimed under: the store ends them with
-- job_finish (kind rescue), which checks both again on the newest row.
SELECT id, lease_token FROM jobs
WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
ORDER BY lease_expires_at, id
LIMIT %(limit)s

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

-- name: next_run_in
{{next_due}}

-- name: next_due
-- Seconds until the next queued job of the queues that is not due yet becomes
-- due, on the server's clock. Jobs already due are left out: if they were not
-- claimed, a busy group or a pause holds them, and a timer set to their (past)
-- run_at would claim in a loop. The second column says whether any of the
-- queues has limits: the store then asks next_run_in_limited instead (see
-- job_claim for why the two are apart). Asked on its own (next_run_in) and by
-- a claim that took fewer jobs than it could (job_claim).
SELECT extract(epoch FROM min(run_at) - {{now}})::float8 AS next_in,
       EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[])) AS limited
FROM jobs
WHERE state = 'queued'
  AND run_at > {{now}}
  AND queue = ANY(%(queues)s::text[])
  AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = jobs.queue AND p.paused)

-- name: queue_set_paused
WITH changed AS (
    INSERT INTO queues (name, paused, updated_at) VALUES (%(name)s, %(paused)s, %(now)s)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at
    RETURNING name, paused
)
SELECT name, CASE WHEN NOT paused THEN pg_notify('conveyor_jobs', name) END FROM changed

-- name: job_retry_failed
-- Bulk manual retry: up to %(limit)s failed jobs of %(queue)s (all queues when
-- NULL) that failed at or before %(before)s. The cutoff is the start of the whole
-- operation, so a job that fails again while a long retry runs is not picked up
-- a second time.
WITH picked AS (
    SELECT j.id, j.state FROM jobs AS j
    WHERE j.state = 'failed' AND j.finished_at <= %(before)s
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND {{retry_key_rule}}
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
{{manual_retry}}

-- name: manual_retry
-- After a CTE named picked (id, state of the finished jobs a manual retry took,
-- locked): each goes back to the queue as new, with its manual_retry event; it
-- leaves its final state's count, and workers of its queue are woken.
changed AS (
    UPDATE jobs SET {{manual_requeue}}
    FROM picked
    WHERE jobs.id = picked.id AND jobs.state = picked.state
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.attempts, picked.state AS was
), changed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'manual_retry', attempts, %(now)s FROM changed ORDER BY id
),
{{finished_counts_retried}},
notified AS (
    {{notify_queues}}
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: notify_queues
-- Wakes the workers of each queue of a CTE named changed: one notification per
-- queue, not per job (a batch is a thousand rows).
SELECT pg_notify('conveyor_jobs', queue) FROM (SELECT DISTINCT queue FROM changed) AS q

-- ---------------------------------------------------------------------------
-- The dashboard and /metrics.

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
SELECT queue, kind, sum(coalesce(jobs, 1))::bigint, max(ARRAY[xid::text::bigint, seq])
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
-- The sessions plan generically (see session_options), which suits the claim;
-- a job list's best plan depends on the values: a rare queue and state walks
-- jobs_queue_state, a common one may as well walk the primary key.
SET LOCAL plan_cache_mode = force_custom_plan

-- name: job_delete_terminal
-- The archive names the jobs it wrote; only those still terminal and finished
-- before its cutoff go (a job retried since then is live again, or newer).
-- Rows are locked in id order so that two archive runs never deadlock.
WITH doomed AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE id = ANY(%(ids)b::bigint[])
      AND state IN ('succeeded', 'failed', 'cancelled')
      AND finished_at < %(before)s
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY id
    FOR UPDATE
),
{{delete_doomed}}
SELECT id FROM gone

-- ---------------------------------------------------------------------------
-- Operating in bulk, groups, retention and the operator's views.
--
-- A selection (JobSelection) filters on every field that is set. job_select and
-- job_count take the column that drives the search (ids, a group, a queue and
-- state, a batch, or none) from a drive_* block, so each can walk an index; the
-- other filters only skip rows (and the store plans them for their values
-- (plan_for_values), so a filter left NULL drops out of the plan). The
-- "detailed state" tells queued jobs apart: due now is ready; due later after an
-- attempt that left an error is retrying; due later otherwise is scheduled (the
-- same rule as job.detailed_state).

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
  -- Encrypted arguments (a JSON string beginning "\/, conveyor.encryption) are
  -- ciphertext: never searched, so no job is found by chance.
  AND (%(args)s::text IS NULL OR (left(args::text, 3) <> E'"\\/'
       AND strpos(lower(args::text || ' ' || kwargs::text), lower(%(args)s::text)) > 0))

-- name: drive_all
true

-- name: drive_ids
id = ANY(%(ids)s::bigint[])

-- name: job_retry_many
-- Manual retry of the failed or cancelled jobs among ids, with the rule for keys
-- of job_retry_failed (retry_key_rule).
WITH picked AS (
    SELECT j.id, j.state FROM jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.state IN ('failed', 'cancelled')
      AND {{retry_key_rule}}
    ORDER BY j.id
    FOR UPDATE SKIP LOCKED
),
{{manual_retry}}

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
), ended AS (
    SELECT id FROM changed WHERE state = 'cancelled'
)
SELECT changed.id
FROM changed,
     (SELECT count(pg_notify('conveyor_cancel', d.ids))
      FROM (SELECT string_agg(id::text, ',') AS ids FROM changed
            WHERE state = 'running' GROUP BY id / 400) AS d) AS asked,
     ({{notify_done}}) AS done

-- name: job_delete_many
-- A running job is left alone: its worker holds it (cancel it first). Rows are
-- locked in id order, so two deletes never deadlock.
WITH doomed AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE id = ANY(%(ids)s::bigint[]) AND state <> 'running'
    ORDER BY id
    FOR UPDATE
),
{{delete_doomed}}
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
    {{notify_queues}}
)
SELECT changed.id FROM changed, (SELECT count(*) FROM notified) AS n

-- name: job_purge_where
-- Finished jobs of the given states (and queue) that ended before the time,
-- oldest first along jobs_finished.
WITH doomed AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE finished_at < %(before)s
      AND state = ANY(%(states)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      -- a queue's age rule leaves a job to its own rule for its state (retain=)
      AND (NOT %(by_policy)s OR retain IS NULL OR NOT retain ? state)
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
{{delete_doomed}}
SELECT count(*) FROM gone

-- name: job_purge_count
SELECT count(*) FROM jobs
WHERE finished_at < %(before)s
  AND state = ANY(%(states)s::text[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)

-- name: job_purge_beyond
-- The jobs of a queue in the final states given past its keep newest of them
-- (by id, the order they were enqueued), up to limit of them. Not locked while
-- chosen (FOR UPDATE would lock the kept rows the offset passes over):
-- delete_doomed checks the state again.
WITH doomed AS MATERIALIZED (
    SELECT id, state FROM jobs
    WHERE queue = %(queue)s AND state = ANY(%(states)s::text[])
      AND {{conveyor.store.postgres/workflows.sql:flow_still_needed}}
    ORDER BY id DESC
    OFFSET %(keep)s
    LIMIT %(limit)s
),
{{delete_doomed}}
SELECT count(*) FROM gone

-- name: delete_doomed
-- After a CTE named doomed (id, state of the jobs to delete): each job still in
-- the state it was chosen in goes, with its events, and finished_counts stays
-- true (finished_counts_forget; run with finished_counts_lock held). Ends in a
-- CTE named gone (the jobs deleted).
gone AS (
    DELETE FROM jobs WHERE (id, state) IN (SELECT id, state FROM doomed)
    RETURNING id, queue, state
), gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM gone) RETURNING queue, kind, xid, seq
),
{{finished_counts_forget}}

-- name: job_insert_rules
-- What every enqueue does with its rows, given a CTE named input (id, queue, task,
-- args json, kwargs json, priority, run_at timestamptz, max_attempts, key,
-- group_key, batch, limit_key, headers json): job_insert ends with it, and so do
-- the statements of other files that include it (conveyor.store.sql), so a column
-- added here must be added to their input too. A row whose key a live job of its
-- queue holds is not inserted (jobs_live_key; the first row of a key wins); the
-- new jobs are counted in an enqueued event per queue and task; workers of each
-- queue with new jobs are woken at commit. Ends in CTEs named new (the jobs inserted) and notified.
--
-- Keyless rows are inserted apart, without ON CONFLICT: with it, PostgreSQL
-- inserts every row speculatively (a token, then a confirmation record in the
-- WAL) whether or not the row has a key. A job that uses no key pays nothing
-- for keys.
new_keyed AS (
    INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                      key, group_key, batch, created_at, limit_key, headers)
    SELECT id, queue, task, args, kwargs, priority, run_at, max_attempts,
           key, group_key, batch, %(now)s, limit_key, headers
    FROM input
    WHERE key IS NOT NULL
    -- Keys in one global order: two producers inserting the same keys wait for
    -- each other's uncommitted rows in the same order, so they never deadlock.
    ORDER BY queue, key, id
    ON CONFLICT (queue, key) WHERE key IS NOT NULL AND state IN ('queued', 'running') DO NOTHING
    RETURNING id, queue, task, created_at
), new_plain AS (
    INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                      key, group_key, batch, created_at, limit_key, headers)
    SELECT id, queue, task, args, kwargs, priority, run_at, max_attempts,
           key, group_key, batch, %(now)s, limit_key, headers
    FROM input
    WHERE key IS NULL
    ORDER BY id
    RETURNING id, queue, task, created_at
), new AS (
    SELECT * FROM new_keyed UNION ALL SELECT * FROM new_plain
), enqueued AS (
    -- One row per queue and task of the statement, counting its jobs (migration
    -- 023): what the per-task metrics count; a job's history shows its enqueue
    -- from created_at. Named after the first of them, and deleted with it.
    INSERT INTO events (job_id, queue, task, kind, attempt, at, jobs)
    SELECT min(id), queue, task, 'enqueued', 0, min(created_at), count(*)
    FROM new GROUP BY queue, task ORDER BY min(id)
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
-- queues without, and for a limited queue a search of its own
-- (claim_search_limited) that starts only as many jobs as its limits leave
-- room for (limit_use, queue_allow).
--
-- Room is counted from running jobs and from limit_starts, which this
-- statement's snapshot may show as they were before another claim of the queue
-- committed. So a claim of a limited queue first locks the queue's limits row
-- (SKIP LOCKED: one claim of a queue at a time; the others pass it by) and
-- compares the version it locked, the newest, with the version its snapshot
-- reads: every claim that starts jobs of the queue bumps it, so equal versions
-- mean the counts are current. A queue whose row was locked or had changed is
-- left for the next claim (next_run_in then answers "now").
--
-- MATERIALIZED: the locking searches must run exactly once.
WITH lim AS MATERIALIZED (
    SELECT l.* FROM limits AS l
    WHERE l.queue = ANY(%(queues)s::text[])
    ORDER BY l.queue
    FOR UPDATE SKIP LOCKED
), allowed AS MATERIALIZED (
    SELECT u.*, {{queue_allow}} AS allow
    FROM (SELECT {{limit_use}}
          FROM lim AS l
          JOIN limits AS seen ON seen.queue = l.queue AND seen.version = l.version
          WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = l.queue AND p.paused)
    ) AS u
), plain AS MATERIALIZED (
    -- The queues without limits, searched as job_claim does.
    SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused)
      AND NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.queue = q.name)
), candidates AS MATERIALIZED (
    SELECT both_kinds.id FROM (
        SELECT c.id, c.priority
        FROM plain AS q
        CROSS JOIN LATERAL ({{claim_search}} LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS c
        UNION ALL
        SELECT c.id, c.priority
        FROM allowed AS a
        CROSS JOIN LATERAL (
            {{claim_search_limited}} LIMIT a.allow FOR UPDATE OF j SKIP LOCKED
        ) AS c
        WHERE a.allow > 0
    ) AS both_kinds
    ORDER BY both_kinds.priority DESC, both_kinds.id
    LIMIT %(limit)s
),
{{claim_apply}},
{{limited_claim_kept}}
-- As job_claim: a last column saying whether any of the queues has limits.
SELECT claimed.*, seen.limited
FROM (SELECT EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[])) AS limited)
     AS seen
LEFT JOIN claimed ON true

-- name: limited_claim_kept
-- After CTEs named allowed (rows of limit_use, locked and current) and claimed:
-- what a claim of limited queues keeps (job_claim_limited, and the fair claim of
-- a queue with limits). Ends in a CTE named bumped.
started AS (
    -- The starts of this claim, for the rates that count them: one row per queue
    -- and limit key, with the number of its jobs this claim started.
    INSERT INTO limit_starts (queue, limit_key, at, jobs)
    SELECT c.queue, c.limit_key, {{now}}, count(*)
    FROM claimed AS c JOIN allowed AS a ON a.queue = c.queue
    WHERE a.rate IS NOT NULL OR a.key_rate IS NOT NULL
    GROUP BY c.queue, c.limit_key
), expired AS (
    -- Starts that left every window of their queue, with %(slack)s seconds to
    -- spare for clocks that step back.
    DELETE FROM limit_starts AS s
    USING allowed AS a
    WHERE s.queue = a.queue
      AND s.at < {{now}} - make_interval(secs => %(slack)s::float8 + greatest(a.per, a.key_per))
), bumped AS (
    UPDATE limits SET version = limits.version + 1
    WHERE limits.queue IN (SELECT a.queue FROM allowed AS a)
      AND limits.queue IN (SELECT c.queue FROM claimed AS c)
)

-- name: limit_use
-- How full limits row l is: its running jobs, its starts in the queue rate's
-- window, and key_rooms, the room each limit key in use has left (running,
-- started in the key rate's window, or throttled) as one JSON map read once per
-- claim ({"customer-42": 0, ...}). A key not in it has all its room (key_room).
l.*,
(SELECT count(*) FROM jobs AS r WHERE r.queue = l.queue AND r.state = 'running') AS running,
(SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
 WHERE s.queue = l.queue AND s.at > {{now}} - make_interval(secs => l.per)) AS started,
(SELECT jsonb_object_agg(k.limit_key, k.room) FROM (
     SELECT x.limit_key,
            least(CASE WHEN bool_or(x.throttled) THEN 0 END,
                  l.key_concurrency - sum(x.running),
                  l.key_rate - sum(x.started)) AS room
     FROM (
         SELECT r.limit_key, 1 AS running, 0 AS started, false AS throttled
         FROM jobs AS r
         WHERE r.queue = l.queue AND r.state = 'running' AND r.limit_key IS NOT NULL
         UNION ALL
         SELECT s.limit_key, 0, s.jobs, false FROM limit_starts AS s
         WHERE s.queue = l.queue AND s.limit_key IS NOT NULL
           AND s.at > {{now}} - make_interval(secs => l.key_per)
         UNION ALL
         SELECT t.limit_key, 0, 0, true FROM limit_throttles AS t
         WHERE t.queue = l.queue AND t.until > {{now}}
     ) AS x
     GROUP BY x.limit_key
 ) AS k) AS key_rooms

-- name: queue_allow
-- How many jobs of the queue of u (a row of limit_use) may start now: at most
-- %(limit)s, none while the queue is throttled, else what its concurrency and
-- rate leave.
least(%(limit)s,
      CASE WHEN u.throttled_until > {{now}} THEN 0 END,
      u.concurrency - u.running,
      u.rate - u.started)::integer

-- name: key_room
-- The room left to the limit key of job j under a (a row of limit_use); NULL
-- when the job has no key, or its key no limit of its own.
CASE WHEN j.limit_key IS NOT NULL
     THEN coalesce((a.key_rooms ->> j.limit_key)::bigint, least(a.key_concurrency, a.key_rate))
END

-- name: claim_search_limited
-- The claimable jobs of limited queue a.queue (a a row of limit_use) in claim
-- order, each key within its room: a job with a limit key only when it is one
-- of its key's oldest ready jobs, as many as the key has room for, so a key
-- with a long backlog is passed over, like a busy group.
SELECT j.id, j.priority FROM jobs AS j
CROSS JOIN LATERAL (
    SELECT {{key_room}} AS key_room
    OFFSET 0  -- computed once per job (inlined, it ran once per use)
) AS kr
WHERE j.queue = a.queue
  AND {{claimable}}
  AND (kr.key_room IS NULL OR (
      kr.key_room > 0
      AND (SELECT count(*) FROM (
              SELECT 1 FROM jobs AS o
              WHERE o.queue = j.queue AND o.limit_key = j.limit_key
                AND o.state = 'queued' AND o.id < j.id AND o.run_at <= {{now}}
              LIMIT kr.key_room) AS older) < kr.key_room))
ORDER BY j.priority DESC, j.id

-- name: next_run_in_limited
-- next_run_in, for queues of which some have limits. Seconds until a claim on
-- the queues could start a job that it cannot now, on the server's clock: when
-- the next queued job that is not due yet becomes due, or, for a queue with
-- limits, when a throttle ends or a full rate window lets the next job through.
-- 0 when a limited queue would let a ready job through already (a claim that
-- ran while another held the limit took none). Jobs already due are otherwise
-- left out: if they were not claimed, a busy group, a pause or a full
-- concurrency limit holds them, a timer set to their (past) run_at would claim
-- in a loop, and what frees them (a job that ends, a resume) notifies the
-- workers. A spent moment (a window that slides while no job waits) costs one
-- empty claim, never a loop. %(limit)s is 1: whether one job could start.
WITH asked AS (
    SELECT q.name AS queue FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused)
), lim AS (
    SELECT u.*, {{queue_allow}} AS allow
    FROM (SELECT {{limit_use}} FROM limits AS l
          WHERE l.queue IN (SELECT queue FROM asked)) AS u
), open_lim AS (
    -- While a queue's throttle lasts, its end is the only moment that counts.
    SELECT lim.* FROM lim
    WHERE lim.throttled_until IS NULL OR lim.throttled_until <= {{now}}
), moments (at) AS (
    SELECT min(run_at) FROM jobs
    WHERE state = 'queued'
      AND run_at > {{now}}
      AND queue IN (SELECT queue FROM asked)
    UNION ALL
    -- A ready job a claim would take now: job_claim_limited's own search.
    SELECT {{now}} FROM lim AS a
    WHERE a.allow > 0 AND EXISTS ({{claim_search_limited}})
    UNION ALL
    SELECT lim.throttled_until FROM lim WHERE lim.throttled_until > {{now}}
    UNION ALL
    SELECT t.until FROM limit_throttles AS t JOIN open_lim AS lim ON lim.queue = t.queue
    WHERE t.until > {{now}}
    UNION ALL
    -- A full window lets one more job start when the start that filled it leaves
    -- it: counting back from the newest, the row whose jobs reach the rate.
    SELECT w.at + make_interval(secs => w.per) FROM (
        SELECT s.at, s.jobs, lim.per, lim.rate,
               sum(s.jobs) OVER (PARTITION BY s.queue ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue
        WHERE lim.rate IS NOT NULL AND s.at > {{now}} - make_interval(secs => lim.per)
    ) AS w
    WHERE w.newer >= w.rate AND w.newer - w.jobs < w.rate
    UNION ALL
    SELECT w.at + make_interval(secs => w.key_per) FROM (
        SELECT s.at, s.jobs, lim.key_per, lim.key_rate,
               sum(s.jobs) OVER (PARTITION BY s.queue, s.limit_key ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue
        WHERE lim.key_rate IS NOT NULL AND s.limit_key IS NOT NULL
          AND s.at > {{now}} - make_interval(secs => lim.key_per)
    ) AS w
    WHERE w.newer >= w.key_rate AND w.newer - w.jobs < w.key_rate
)
SELECT extract(epoch FROM min(moments.at) - {{now}})::float8,
       EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))
FROM moments

-- name: limit_any
SELECT EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))

-- name: limit_set
-- Set the limit of one scope ('queue' or 'key') of a queue; the other scope's
-- stays, and so do the parts of this one the caller keeps (keep_rate,
-- keep_concurrency: decided here, so that two calls that set different parts
-- never undo each other). Workers waiting on the queue hear of it (a limit
-- raised lets them claim).
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
        rate = CASE WHEN %(scope)s = 'queue' AND NOT %(keep_rate)s::boolean THEN excluded.rate
                    ELSE limits.rate END,
        per = CASE WHEN %(scope)s = 'queue' AND NOT %(keep_rate)s::boolean THEN excluded.per
                   ELSE limits.per END,
        concurrency = CASE WHEN %(scope)s = 'queue' AND NOT %(keep_concurrency)s::boolean THEN excluded.concurrency
                           ELSE limits.concurrency END,
        key_rate = CASE WHEN %(scope)s = 'key' AND NOT %(keep_rate)s::boolean THEN excluded.key_rate
                        ELSE limits.key_rate END,
        key_per = CASE WHEN %(scope)s = 'key' AND NOT %(keep_rate)s::boolean THEN excluded.key_per
                       ELSE limits.key_per END,
        key_concurrency = CASE WHEN %(scope)s = 'key' AND NOT %(keep_concurrency)s::boolean
                               THEN excluded.key_concurrency ELSE limits.key_concurrency END,
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

-- name: limit_usage
-- Every limit and how full it is (limit_use): running jobs, starts in the queue
-- rate's window, ready jobs, and of the keys with ready jobs those that are held
-- back (no room left: throttled, or at their rate or concurrency) and the ready
-- jobs beyond their keys' room. Reads every ready job with a limit key of a
-- limited queue: a view for operators, not a path of the claim.
WITH used AS (
    SELECT {{limit_use}} FROM limits AS l
), per_key AS (
    SELECT queue, limit_key, count(*) AS ready, min(room) AS room
    FROM (SELECT a.queue, j.limit_key, {{key_room}} AS room
          FROM jobs AS j JOIN used AS a ON a.queue = j.queue
          WHERE j.limit_key IS NOT NULL AND j.state = 'queued' AND j.run_at <= {{now}}
    ) AS ready_keys
    GROUP BY queue, limit_key
)
SELECT u.queue, u.rate, u.per, u.concurrency, u.key_rate, u.key_per, u.key_concurrency,
       u.throttled_until, u.running, CASE WHEN u.rate IS NULL THEN 0 ELSE u.started END,
       (SELECT count(*) FROM jobs AS q
        WHERE q.queue = u.queue AND q.state = 'queued' AND q.run_at <= {{now}}),
       (SELECT count(*) FROM per_key AS k WHERE k.queue = u.queue AND k.room <= 0),
       -- room NULL: the key has no limit of its own (greatest() would read NULL as 0).
       (SELECT coalesce(sum(CASE WHEN k.room IS NULL THEN 0
                                 ELSE greatest(k.ready - greatest(k.room, 0), 0) END), 0)
        FROM per_key AS k
        WHERE k.queue = u.queue),
       (SELECT count(*) FROM limit_throttles AS t WHERE t.queue = u.queue AND t.until > {{now}})
FROM used AS u
ORDER BY u.queue

-- name: limit_prune_all_starts
-- Maintenance: starts that left every window of their queue (or whose queue has
-- no rate any more), with %(slack)s seconds to spare.
DELETE FROM limit_starts
WHERE at < %(now)s - make_interval(secs => %(slack)s::float8 + coalesce(
          (SELECT greatest(l.per, l.key_per) FROM limits AS l WHERE l.queue = limit_starts.queue),
          0))

