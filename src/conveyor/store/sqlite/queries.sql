-- Named statements of the SQLite store. Times are REAL epoch seconds; ``:now`` is
-- always passed in, never read from the database clock, so tests can fix it.
--
-- Batched writes take one JSON array parameter (``:items``) and join it with
-- json_each: one statement per batch, however many jobs it touches. Every write
-- runs inside BEGIN IMMEDIATE, so SQLite's single writer makes each
-- read-then-write atomic without row locks.

-- with: conveyor.store/shared.sql

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)

-- name: job_take_ids
-- Reserve :count ids; returns the last one. Under the write lock, so no one
-- else takes ids between this and the insert.
UPDATE counters SET value = value + :count WHERE name = 'jobs' RETURNING value

-- name: job_insert
INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                  key, group_key, batch, created_at, limit_key, headers)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: event_insert_enqueued
INSERT INTO events (job_id, queue, task, kind, attempt, at)
SELECT id, queue, task, 'enqueued', 0, created_at FROM jobs WHERE id BETWEEN :first AND :last

-- name: job_find_keys
-- :pairs is [[queue, key], ...]; every job holding one of them, newest first.
SELECT * FROM jobs
WHERE key IS NOT NULL
  AND (queue, key) IN (SELECT value ->> 0, value ->> 1 FROM json_each(:pairs))
ORDER BY id DESC

-- name: job_get_many
SELECT * FROM jobs WHERE id IN (SELECT value FROM json_each(:ids))

-- name: job_claim
-- Each queue is searched on its own (the correlated subquery walks the
-- jobs_queued index of one queue in claim order and stops at :limit); the best
-- of those candidates win. A single "queue IN (...) ORDER BY" would sort every
-- queued job on each claim.
UPDATE jobs SET {{claim_set}}
WHERE id IN (
    SELECT c.id
    FROM json_each(:queues) AS q
    JOIN jobs AS c ON c.id IN (
        SELECT j.id FROM jobs AS j
        WHERE j.queue = q.value AND {{claimable}}
        ORDER BY j.priority DESC, j.id
        LIMIT :limit)
    WHERE q.value NOT IN (SELECT name FROM queues WHERE paused)
    ORDER BY c.priority DESC, c.id
    LIMIT :limit
)
RETURNING *

-- name: now
-- The moment a statement judges by, as the blocks of shared.sql name it.
:now

-- name: claim_set
-- What a claim sets on the jobs it starts under its lease.
state = 'running',
attempts = attempts + 1,
worker = :worker,
lease_token = :token,
lease_expires_at = :lease_expires_at,
started_at = :now,
progress = NULL,
progress_message = NULL

-- name: event_insert_for_jobs
-- One event for each job of :ids (cancel, retry, hold...). :kinds maps the state
-- the job is now in to the event kind (e.g. {"cancelled": "cancelled"}); a job
-- in a state the map does not name gets no event.
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
SELECT id, queue, task, :kinds ->> state, attempts, worker, :now
FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND (:kinds ->> state) IS NOT NULL
ORDER BY id

-- name: job_heartbeat
-- :items is [[id, token], ...]
UPDATE jobs
SET lease_expires_at = :lease_expires_at
FROM json_each(:items) AS l
WHERE jobs.id = l.value ->> 0
  AND jobs.lease_token = l.value ->> 1
  AND jobs.state = 'running'
RETURNING jobs.id, jobs.cancel_requested

-- name: job_finish
-- The one statement that ends running jobs, for every kind of outcome (see
-- FinishKind in store/base.py): which jobs it may end is finish_fence, what
-- becomes of them finish_set (both in shared.sql). :items is [[id, token,
-- kind, result, error, run_at], ...]; event_insert_finished records the events.
UPDATE jobs
SET {{finish_set}}
FROM (SELECT value ->> 0 AS id, value ->> 1 AS token, value ->> 2 AS kind,
             value ->> 3 AS result, value ->> 4 AS error, value ->> 5 AS run_at
      FROM json_each(:items)) AS f
WHERE {{finish_fence}}
RETURNING jobs.id

-- name: event_insert_finished
-- The events of the jobs job_finish just changed (same transaction), as
-- finish_event in shared.sql says. :items is [[id, kind], ...].
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error, started_at)
SELECT jobs.id, {{finish_event}}
FROM (SELECT value ->> 0 AS id, value ->> 1 AS kind FROM json_each(:items)) AS f
JOIN jobs ON jobs.id = f.id
JOIN (SELECT 1 AS ordinal UNION ALL SELECT 2) AS o ON {{finish_event_wanted}}
ORDER BY o.ordinal, jobs.id

-- name: job_expired_leases
-- Running jobs whose lease ran out, with the lease they were claimed under:
-- the store ends them with job_finish (kind rescue), which checks both again.
SELECT id, lease_token FROM jobs
WHERE state = 'running' AND lease_expires_at < :now
ORDER BY lease_expires_at, id
LIMIT :limit

-- name: event_delete_for_jobs
DELETE FROM events WHERE job_id IN (SELECT value FROM json_each(:ids))

-- name: job_delete
DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(:ids))

-- name: event_since
SELECT * FROM events WHERE seq > :seq ORDER BY seq LIMIT :limit

-- name: stats_counts
-- Finished and running jobs per queue and state, without reading the finished
-- ones: finished_counts plus the finishing events not yet folded into it (see
-- migration 011), and running jobs from their partial index. The same cost at a
-- thousand finished jobs and at a hundred million. Queued jobs: stats_queued.
SELECT queue, state, sum(n) FROM (
    SELECT queue, state, jobs AS n FROM finished_counts
    UNION ALL
    SELECT queue, kind, count(*) FROM events
    WHERE seq > (SELECT seq FROM finished_counts_folded)
      AND kind IN ('succeeded', 'failed', 'cancelled')
    GROUP BY queue, kind
    UNION ALL
    SELECT queue, 'running', count(*) FROM jobs INDEXED BY jobs_running_lease
    WHERE state = 'running' GROUP BY queue
)
GROUP BY queue, state
HAVING sum(n) <> 0

-- name: stats_queued
-- Queued jobs per queue: how many, the oldest due time among those due now, and
-- how many are due later, from jobs_queued alone (it holds run_at).
SELECT queue, count(*), min(CASE WHEN run_at <= :now THEN run_at END),
       sum(run_at > :now)
FROM jobs INDEXED BY jobs_queued
WHERE state = 'queued'
GROUP BY queue

-- name: stats_retrying
-- Of the queued jobs due later, those waiting after a failed attempt: the rows
-- of due-later jobs only are read (run_at is checked in the index first).
SELECT queue, count(*) FROM jobs INDEXED BY jobs_queued
WHERE state = 'queued' AND run_at > :now AND error IS NOT NULL AND attempts > 0
GROUP BY queue

-- name: finished_counts_offset
-- The newest event folded into finished_counts, and the newest event.
SELECT (SELECT seq FROM finished_counts_folded), (SELECT coalesce(max(seq), 0) FROM events)

-- name: finished_counts_fold
-- Add the finishes recorded by events after the folded offset, up to :upto (the
-- caller moves the offset there in the same transaction). One writer at a time:
-- events commit in seq order, so none can appear below :upto later.
INSERT INTO finished_counts (queue, state, jobs)
SELECT queue, kind, count(*) FROM events
WHERE seq > (SELECT seq FROM finished_counts_folded) AND seq <= :upto
  AND kind IN ('succeeded', 'failed', 'cancelled')
GROUP BY queue, kind
ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs

-- name: finished_counts_fold_offset
UPDATE finished_counts_folded SET seq = :upto WHERE seq < :upto

-- name: finished_counts_forget
-- Before jobs :ids and their events are deleted, in the same transaction: take
-- each finished one off its state's count, and add back its finishing events
-- that were not yet folded (deleted, they will never be: their counts move
-- into the table now).
INSERT INTO finished_counts (queue, state, jobs)
SELECT queue, state, sum(n) FROM (
    SELECT queue, state, -1 AS n FROM jobs
    WHERE id IN (SELECT value FROM json_each(:ids))
      AND state IN ('succeeded', 'failed', 'cancelled')
    UNION ALL
    SELECT queue, kind, 1 FROM events
    WHERE job_id IN (SELECT value FROM json_each(:ids))
      AND kind IN ('succeeded', 'failed', 'cancelled')
      AND seq > (SELECT seq FROM finished_counts_folded)
)
WHERE true  -- (an INSERT ... SELECT before ON CONFLICT needs a WHERE)
GROUP BY queue, state
ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs

-- name: finished_counts_add
-- Change counts by :deltas, a JSON list of [queue, state, change]: a manual
-- retry takes its jobs off the state they left, in its transaction.
INSERT INTO finished_counts (queue, state, jobs)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
       sum(json_extract(value, '$[2]'))
FROM json_each(:deltas)
WHERE true
GROUP BY 1, 2
ON CONFLICT (queue, state) DO UPDATE SET jobs = jobs + excluded.jobs

-- name: job_states
SELECT id, queue, state FROM jobs WHERE id IN (SELECT value FROM json_each(:ids))

-- name: next_run_at
-- The next moment a claim on :queues could start a job that it cannot now:
-- when the next queued job that is not due yet becomes due, or, for a queue
-- with limits (see the flow control section), when a throttle ends or a full
-- rate window lets the next job through. :now itself when a limited queue
-- would let a ready job through already (a claim that ran while another held
-- the limit saw none). Jobs already due are otherwise left out: if they were not
-- claimed, a busy group, a pause or a full concurrency limit holds them, a timer
-- set to their (past) run_at would claim in a loop, and what frees them (a job
-- that ends, a resume) wakes the workers. A spent moment (a window that slides
-- while no job waits) costs one empty claim, never a loop. :limit is as large
-- as a claim's can be.
WITH asked AS (
    SELECT q.value AS queue FROM json_each(:queues) AS q
    WHERE q.value NOT IN (SELECT name FROM queues WHERE paused)
), lim AS (
    SELECT u.*, {{queue_allow}} AS allow
    FROM (SELECT {{limit_use}} FROM limits AS l WHERE l.queue IN (SELECT queue FROM asked)) AS u
), open_lim AS (
    -- While a queue's throttle lasts, its end is the only moment that counts.
    SELECT * FROM lim WHERE throttled_until IS NULL OR throttled_until <= :now
), moments (at) AS (
    SELECT min(run_at) FROM jobs
    WHERE state = 'queued'
      AND run_at > :now
      AND queue IN (SELECT queue FROM asked)
    UNION ALL
    -- A ready job a claim would take now: job_claim_limited's tests, job by job.
    SELECT :now FROM lim AS a
    WHERE a.allow > 0
      AND EXISTS (SELECT 1 FROM jobs AS j
                  WHERE j.queue = a.queue AND {{claimable}} AND {{key_within_room}})
    UNION ALL
    SELECT throttled_until FROM lim WHERE throttled_until > :now
    UNION ALL
    SELECT t.until FROM limit_throttles AS t JOIN open_lim AS lim ON lim.queue = t.queue
    WHERE t.until > :now
    UNION ALL
    -- A full window lets one more job start when the start that filled it leaves
    -- it: counting back from the newest, the row whose jobs reach the rate.
    SELECT at + per FROM (
        SELECT s.at, s.jobs, lim.per, lim.rate,
               sum(s.jobs) OVER (PARTITION BY s.queue ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue
        WHERE lim.rate IS NOT NULL AND s.at > :now - lim.per)
    WHERE newer >= rate AND newer - jobs < rate
    UNION ALL
    SELECT at + key_per FROM (
        SELECT s.at, s.jobs, lim.key_per, lim.key_rate,
               sum(s.jobs) OVER (PARTITION BY s.queue, s.limit_key ORDER BY s.at DESC
                                 ROWS UNBOUNDED PRECEDING) AS newer
        FROM limit_starts AS s JOIN open_lim AS lim ON lim.queue = s.queue
        WHERE lim.key_rate IS NOT NULL AND s.limit_key IS NOT NULL AND s.at > :now - lim.key_per)
    WHERE newer >= key_rate AND newer - jobs < key_rate
)
SELECT min(at) FROM moments

-- name: queue_set_paused
INSERT INTO queues (name, paused, updated_at) VALUES (:name, :paused, :now)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at

-- name: job_retry_failed
-- Bulk manual retry: up to :limit failed jobs of :queue (all queues when NULL)
-- that failed at or before :before. The cutoff is the start of the whole
-- operation, so a job that fails again while a long retry runs is not picked up
-- a second time. Keys: retry_key_rule (shared.sql).
UPDATE jobs SET {{manual_requeue}}
WHERE id IN (
    SELECT j.id FROM jobs AS j
    WHERE j.state = 'failed' AND j.finished_at <= :before
      AND (:queue IS NULL OR j.queue = :queue)
      AND {{retry_key_rule}}
    ORDER BY j.id
    LIMIT :limit)
RETURNING id, queue  -- every job retried here was failed

-- ---------------------------------------------------------------------------
-- The dashboard and /metrics.

-- name: stats_finished_per_slot
-- Jobs that reached a terminal state since :since, per queue, state and slot of
-- :slot seconds (slot 0 starts at :since): the throughput chart. Reads the
-- jobs_finished index range of that hour only: INDEXED BY, because with
-- statistics the planner preferred walking all of jobs_queue_state in GROUP BY
-- order (1.4 s instead of 70 ms at a million jobs).
SELECT queue, state, CAST((finished_at - :since) / :slot AS INTEGER) AS slot_index, count(*)
FROM jobs INDEXED BY jobs_finished
WHERE finished_at >= :since AND finished_at IS NOT NULL
GROUP BY queue, state, slot_index

-- name: event_count_by_kind
-- Events after :after_seq per queue and kind, with the last seq counted: /metrics
-- adds these to its counters and asks again from there, reading only new events.
-- One writer at a time: events commit in seq order.
SELECT queue, kind, count(*), max(seq) FROM events
WHERE seq > :after_seq
GROUP BY queue, kind

-- name: event_offset
SELECT 0, coalesce(max(seq), 0) FROM events

-- name: job_run_time_histogram
-- Run time (started_at to finished_at of the last attempt) of the jobs that ended
-- in (:after, :until], per queue and bucket; bucket i counts run times above
-- :bounds[i-1] and at most :bounds[i] (Prometheus "le" buckets, not cumulative).
SELECT queue,
       (SELECT count(*) FROM json_each(:bounds) WHERE value < finished_at - started_at)
           AS bucket,
       count(*),
       sum(finished_at - started_at)
FROM jobs INDEXED BY jobs_finished  -- the window's range, not all of jobs_queue_state
WHERE finished_at > :after AND finished_at <= :until
  AND state IN ('succeeded', 'failed') AND started_at IS NOT NULL
GROUP BY queue, bucket

-- name: job_delete_terminal_select
-- The archive names the jobs it wrote; only those still terminal and finished
-- before its cutoff go (a job retried since then is live again, or newer).
SELECT id FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND state IN ('succeeded', 'failed', 'cancelled')
  AND finished_at < :before

-- ---------------------------------------------------------------------------
-- Operating in bulk, groups, retention and the operator's views.
--
-- A selection (JobSelection) filters on every field that is set. job_select and
-- job_count take the column that drives the search (ids, a group, a queue and
-- state, a queue, a batch, or none) from a drive_* block, so each can walk an
-- index; the other filters only skip rows. The "detailed state" tells queued
-- jobs apart: due now is ready; due later after an attempt that left an error is
-- retrying; due later otherwise is scheduled (the same rule as job.detailed_state).

-- name: selection_filters
-- The filters of a selection that only skip rows: included by every job_select
-- and job_count statement after its driving condition (which may repeat one of
-- them: a filter that is set twice costs nothing). The text of the arguments is
-- searched only in jobs above args_floor (the newest ones, see selection.py; 0
-- when there is no such search): no index serves a search inside JSON text, and
-- the bound stands apart from the OR so that the primary key's range serves it.
id > :args_floor
  AND (:queue IS NULL OR queue = :queue)
  AND (:task IS NULL OR task = :task)
  AND (:group IS NULL OR group_key = :group)
  AND (:batch IS NULL OR batch = :batch)
  AND (:worker IS NULL OR worker = :worker)
  AND (:key IS NULL OR key = :key)
  AND (:limit_key IS NULL OR limit_key = :limit_key)
  AND (:error IS NULL OR instr(lower(error), lower(:error)) > 0)
  -- Encrypted arguments (a JSON string beginning "\/, conveyor.encryption) are
  -- ciphertext: never searched, so no job is found by chance.
  AND (:args IS NULL OR (substr(args, 1, 3) <> '"\/'
                         AND instr(lower(args || ' ' || kwargs), lower(:args)) > 0))

-- name: drive_all
1

-- name: drive_ids
id IN (SELECT value FROM json_each(:ids))

-- name: job_retry_many
-- Manual retry of the failed or cancelled jobs among :ids, with the rule for
-- keys of job_retry_failed.
UPDATE jobs SET {{manual_requeue}}
WHERE id IN (
    SELECT j.id FROM jobs AS j
    WHERE j.id IN (SELECT value FROM json_each(:ids))
      AND (j.state = 'failed' OR j.state = 'cancelled')
      AND {{retry_key_rule}})
RETURNING id

-- name: job_cancel_many_queued
UPDATE jobs
SET state = 'cancelled', finished_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'queued'
RETURNING id

-- name: job_cancel_many_running
UPDATE jobs
SET cancel_requested = 1
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'running' AND NOT cancel_requested
RETURNING id

-- name: job_delete_many_select
-- A running job is left alone: its worker holds it (cancel it first).
SELECT id FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND state <> 'running'

-- name: job_run_now
UPDATE jobs
SET run_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'queued' AND run_at > :now
RETURNING id

-- name: job_purge_where_select
-- Finished jobs of the given states (and queue) that ended before :before,
-- oldest first along jobs_finished.
SELECT id FROM jobs
WHERE finished_at < :before
  AND state IN (SELECT value FROM json_each(:states))
  AND (:queue IS NULL OR queue = :queue)
  -- a queue's age rule leaves a job to its own rule for its state (retain=)
  AND (NOT :by_policy OR retain IS NULL OR json_type(retain, '$.' || state) IS NULL)
ORDER BY finished_at
LIMIT :limit

-- name: job_purge_count
SELECT count(*) FROM jobs
WHERE finished_at < :before
  AND state IN (SELECT value FROM json_each(:states))
  AND (:queue IS NULL OR queue = :queue)

-- name: job_purge_beyond_select
-- The jobs of a queue in :states (final states, as JSON) past its :keep newest
-- of them (by id, the order they were enqueued), up to :limit of them.
SELECT id FROM jobs
WHERE queue = :queue AND state IN (SELECT value FROM json_each(:states))
ORDER BY id DESC
LIMIT :limit OFFSET :keep

-- ---------------------------------------------------------------------------
-- Flow control: rate and concurrency limits per queue and per limit key.
--
-- A queue with a row in limits is claimed by job_claim_limited (job_claim is
-- left as it was for the others: the store looks for a limit row first, in the
-- same transaction). The claim reads the limits and their usage and records its
-- starts under SQLite's write lock, so what it reads is what it counts against.
-- Usage: a concurrency counts the running jobs (of the queue, or of the key); a
-- rate counts the rows of limit_starts in its window; a throttle is a moment
-- (limits.throttled_until for the queue, limit_throttles for a key).

-- name: limit_any
SELECT 1 FROM limits WHERE queue IN (SELECT value FROM json_each(:queues)) LIMIT 1

-- name: job_claim_limited
-- job_claim, for queues of which some have limits. Each asked queue gets an
-- allowance (:limit without limits; else queue_allow), and a job with a limit
-- key must be within its key's room (key_within_room). Of the candidates, at
-- most a queue's allowance per queue are taken.
WITH asked AS (
    SELECT q.value AS queue, u.*,
           CASE WHEN u.queue IS NULL THEN :limit ELSE {{queue_allow}} END AS allow
    FROM json_each(:queues) AS q
    LEFT JOIN (SELECT {{limit_use}} FROM limits AS l
               WHERE l.queue IN (SELECT value FROM json_each(:queues))) AS u
           ON u.queue = q.value
    WHERE q.value NOT IN (SELECT name FROM queues WHERE paused)
), candidates AS (
    SELECT c.id, c.priority, c.queue, a.allow
    FROM asked AS a
    JOIN jobs AS c ON c.id IN (
        SELECT j.id FROM jobs AS j
        WHERE j.queue = a.queue AND {{claimable}} AND {{key_within_room}}
        ORDER BY j.priority DESC, j.id
        LIMIT :limit)
    WHERE a.allow > 0
), chosen AS (
    -- At most a queue's allowance per queue (the key rule above keeps each key
    -- within its room), the best first.
    SELECT id FROM (
        SELECT candidates.id, candidates.priority, candidates.allow,
               row_number() OVER (PARTITION BY queue ORDER BY priority DESC, id) AS nth
        FROM candidates)
    WHERE nth <= allow
    ORDER BY priority DESC, id
    LIMIT :limit
)
UPDATE jobs SET {{claim_set}}
WHERE id IN (SELECT id FROM chosen)
RETURNING *

-- name: limit_use
-- How full limits row l is: its running jobs, its starts in the queue rate's
-- window, and key_rooms, the room each limit key in use has left (running,
-- started in the key rate's window, or throttled) as one JSON map read once per
-- claim ({"k637573746F6D65722D3432": 0, ...}); NULL in it when the key has no
-- limit of its own. A key not in it has all its room (key_room). The map's keys
-- are 'k' and the key's hex: the right side of ->> is a JSON path when it starts
-- with '$' (and a label only up to a '.' or '['), so a key itself would be read
-- as syntax; hex digits never are, and the lookup stays one step.
l.*,
(SELECT count(*) FROM jobs AS r WHERE r.queue = l.queue AND r.state = 'running') AS running,
(SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s
 WHERE s.queue = l.queue AND s.at > :now - l.per) AS started,
(SELECT json_group_object('k' || hex(k.limit_key), k.room) FROM (
     SELECT x.limit_key,
            -- min() of SQLite is NULL when any argument is: "no limit" is the
            -- largest integer for it, and NULL again after.
            nullif(min(CASE WHEN max(x.throttled) THEN 0 ELSE 2147483647 END,
                       coalesce(l.key_concurrency - sum(x.running), 2147483647),
                       coalesce(l.key_rate - sum(x.started), 2147483647)), 2147483647) AS room
     FROM (
         SELECT r.limit_key, 1 AS running, 0 AS started, 0 AS throttled
         FROM jobs AS r
         WHERE r.queue = l.queue AND r.state = 'running' AND r.limit_key IS NOT NULL
         UNION ALL
         SELECT s.limit_key, 0, s.jobs, 0 FROM limit_starts AS s
         WHERE s.queue = l.queue AND s.limit_key IS NOT NULL AND s.at > :now - l.key_per
         UNION ALL
         SELECT t.limit_key, 0, 0, 1 FROM limit_throttles AS t
         WHERE t.queue = l.queue AND t.until > :now
     ) AS x
     GROUP BY x.limit_key
 ) AS k) AS key_rooms

-- name: queue_allow
-- How many jobs of the queue of u (a row of limit_use) may start now: at most
-- :limit, none while the queue is throttled, else what its concurrency and rate
-- leave.
min(:limit,
    CASE WHEN u.throttled_until > :now THEN 0 ELSE :limit END,
    coalesce(u.concurrency - u.running, :limit),
    coalesce(u.rate - u.started, :limit))

-- name: key_room
-- The room left to the limit key of job j under a (a row of limit_use); NULL
-- when the job has no key, or its key no limit of its own.
CASE WHEN j.limit_key IS NOT NULL AND a.queue IS NOT NULL THEN
    coalesce(a.key_rooms ->> ('k' || hex(j.limit_key)),
             nullif(min(coalesce(a.key_concurrency, 2147483647),
                        coalesce(a.key_rate, 2147483647)), 2147483647))
END

-- name: key_within_room
-- Whether job j of queue a (a row of limit_use) is within its key's room: a job
-- with a limit key only when it is one of its key's oldest ready jobs, as many
-- as the key has room for (the older ones counted up to :limit), so a key with
-- a long backlog is passed over like a busy group.
(SELECT k.room IS NULL OR (k.room > 0 AND (
     SELECT count(*) FROM (
         SELECT 1 FROM jobs AS o
         WHERE o.queue = j.queue AND o.limit_key = j.limit_key
           AND o.state = 'queued' AND o.id < j.id AND o.run_at <= :now
         LIMIT :limit)) < k.room)
 FROM (SELECT {{key_room}} AS room) AS k)

-- name: limit_record_starts
-- The starts of a claim, for the rates that count them (same transaction): one
-- row per queue and limit key, with the number of its jobs the claim started.
INSERT INTO limit_starts (queue, limit_key, at, jobs)
SELECT j.queue, j.limit_key, :now, count(*) FROM jobs AS j
WHERE j.id IN (SELECT value FROM json_each(:ids))
  AND j.queue IN (SELECT queue FROM limits WHERE rate IS NOT NULL OR key_rate IS NOT NULL)
GROUP BY j.queue, j.limit_key

-- name: limit_prune_starts
-- Starts that left every window of their queue, with :slack seconds to spare for
-- clocks that step back; a claim prunes its own queues as it goes, maintenance
-- the rest (limit_prune). Driven by the limits rows, so that each queue's cutoff
-- is one range of limit_starts_queue.
DELETE FROM limit_starts
WHERE rowid IN (
    SELECT s.rowid FROM limits AS l
    JOIN limit_starts AS s ON s.queue = l.queue
    WHERE l.queue IN (SELECT value FROM json_each(:queues))
      AND s.at < :now - :slack - max(coalesce(l.per, 0), coalesce(l.key_per, 0)))

-- name: limit_set
-- Set the limit of one scope ('queue' or 'key') of a queue; the other scope's
-- stays, and so do the parts of this one the caller keeps (keep_rate,
-- keep_concurrency: decided here, so that two calls that set different parts
-- never undo each other).
INSERT INTO limits (queue, rate, per, concurrency, key_rate, key_per, key_concurrency, updated_at)
VALUES (:queue,
        CASE WHEN :scope = 'queue' THEN :rate END,
        CASE WHEN :scope = 'queue' THEN :per END,
        CASE WHEN :scope = 'queue' THEN :concurrency END,
        CASE WHEN :scope = 'key' THEN :rate END,
        CASE WHEN :scope = 'key' THEN :per END,
        CASE WHEN :scope = 'key' THEN :concurrency END,
        :now)
ON CONFLICT (queue) DO UPDATE SET
    rate = CASE WHEN :scope = 'queue' AND NOT :keep_rate THEN excluded.rate ELSE limits.rate END,
    per = CASE WHEN :scope = 'queue' AND NOT :keep_rate THEN excluded.per ELSE limits.per END,
    concurrency = CASE WHEN :scope = 'queue' AND NOT :keep_concurrency THEN excluded.concurrency
                       ELSE limits.concurrency END,
    key_rate = CASE WHEN :scope = 'key' AND NOT :keep_rate THEN excluded.key_rate ELSE limits.key_rate END,
    key_per = CASE WHEN :scope = 'key' AND NOT :keep_rate THEN excluded.key_per ELSE limits.key_per END,
    key_concurrency = CASE WHEN :scope = 'key' AND NOT :keep_concurrency
                           THEN excluded.key_concurrency ELSE limits.key_concurrency END,
    version = limits.version + 1,
    updated_at = excluded.updated_at

-- name: limit_forget_empty
-- A queue left with no limit and no throttle goes back to the plain claim.
DELETE FROM limits
WHERE queue = :queue
  AND rate IS NULL AND concurrency IS NULL AND key_rate IS NULL AND key_concurrency IS NULL
  AND (throttled_until IS NULL OR throttled_until <= :now)
  AND NOT EXISTS (SELECT 1 FROM limit_throttles AS t WHERE t.queue = :queue AND t.until > :now)

-- name: limit_throttle_queue
-- Hold the whole queue back until :until (a throttle is never shortened by another).
INSERT INTO limits (queue, throttled_until, updated_at) VALUES (:queue, :until, :now)
ON CONFLICT (queue) DO UPDATE SET
    throttled_until = max(coalesce(limits.throttled_until, 0), excluded.throttled_until),
    version = limits.version + 1,
    updated_at = excluded.updated_at
RETURNING throttled_until

-- name: limit_throttle_key
-- Hold one key of the queue back until :until; the queue gets a limits row, so
-- that its claims look at key throttles.
INSERT INTO limit_throttles (queue, limit_key, until) VALUES (:queue, :key, :until)
ON CONFLICT (queue, limit_key) DO UPDATE SET until = max(limit_throttles.until, excluded.until)
RETURNING until

-- name: limit_ensure
INSERT INTO limits (queue, updated_at) VALUES (:queue, :now) ON CONFLICT (queue) DO NOTHING

-- name: limit_lift_queue
UPDATE limits SET throttled_until = NULL, updated_at = :now WHERE queue = :queue

-- name: limit_lift_key
DELETE FROM limit_throttles WHERE queue = :queue AND limit_key = :key

-- name: limit_usage
-- Every limit and how full it is at :now (limit_use): running jobs, starts in
-- the queue rate's window, ready jobs, and of the keys with ready jobs those
-- that are held back (no room left: throttled, or at their rate or concurrency)
-- and the ready jobs beyond their keys' room. Reads every ready job with a
-- limit key of a limited queue: a view for operators, not a path of the claim.
WITH used AS (
    SELECT {{limit_use}} FROM limits AS l
), per_key AS (
    SELECT queue, limit_key, count(*) AS ready, min(room) AS room
    FROM (SELECT a.queue, j.limit_key, {{key_room}} AS room
          FROM jobs AS j JOIN used AS a ON a.queue = j.queue
          WHERE j.limit_key IS NOT NULL AND j.state = 'queued' AND j.run_at <= :now)
    GROUP BY queue, limit_key
)
SELECT u.queue, u.rate, u.per, u.concurrency, u.key_rate, u.key_per, u.key_concurrency,
       u.throttled_until, u.running, CASE WHEN u.rate IS NULL THEN 0 ELSE u.started END,
       (SELECT count(*) FROM jobs AS q
        WHERE q.queue = u.queue AND q.state = 'queued' AND q.run_at <= :now),
       (SELECT count(*) FROM per_key AS k WHERE k.queue = u.queue AND k.room <= 0),
       -- room NULL: the key has no limit of its own.
       (SELECT coalesce(sum(CASE WHEN k.room IS NULL THEN 0
                                 ELSE max(k.ready - max(k.room, 0), 0) END), 0)
        FROM per_key AS k WHERE k.queue = u.queue),
       (SELECT count(*) FROM limit_throttles AS t WHERE t.queue = u.queue AND t.until > :now)
FROM used AS u
ORDER BY u.queue

-- name: limit_prune_all_starts
-- Maintenance: starts that left every window of their queue (or whose queue has
-- no rate any more), with :slack seconds to spare.
DELETE FROM limit_starts
WHERE at < :now - :slack - coalesce((SELECT max(coalesce(per, 0), coalesce(key_per, 0))
                                     FROM limits WHERE limits.queue = limit_starts.queue), 0)

