-- Named statements of the PostgreSQL store, side by side with the SQLite ones.
--
-- Times are timestamptz and the current time is always a parameter (now), never
-- the database clock, so tests can fix it. Batched writes take one array per
-- column and join them with unnest(): one statement per batch, however many
-- jobs it touches. Every write to a running job names its lease token and
-- state in the WHERE clause: the compare-and-set that fences out stale workers.
--
-- Each change writes its events in the same statement, through data-modifying
-- CTEs, and sends its notifications there too (they are delivered on commit).
-- A CTE that only reads runs only when the main query reads it, hence the
-- "CROSS JOIN notified" at the end of those statements; "notified" yields
-- exactly one row.
--
-- Channels: conveyor_jobs (payload: a queue with new ready work),
-- conveyor_cancel (payload: a job id whose cancel was requested) and
-- conveyor_done (payload: a job id that reached a terminal state).
--
-- Parameters are cast where they are used: psycopg sends None untyped.

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
)

-- name: migrations_lock
-- One migrator at a time, across processes; released when the transaction ends.
SELECT pg_advisory_xact_lock(%(key)s::bigint)

-- name: migrations_exist
SELECT to_regclass('schema_migrations') IS NOT NULL

-- name: schema_version
SELECT coalesce(max(version), 0) FROM schema_migrations

-- name: migration_record
INSERT INTO schema_migrations (version, name, applied_at)
VALUES (%(version)s, %(name)s, %(now)s)

-- name: table_columns
SELECT column_name::text FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = %(table)s
ORDER BY ordinal_position

-- name: job_insert
-- One row per job to insert. Ids come from the table's sequence in input order
-- and are returned with each input row, so the caller maps rows back to its
-- positions; "inserted" is false for a keyed row that lost to a live job with
-- the same (queue, key) committed meanwhile by another producer.
WITH input AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id, i.*
    FROM unnest(%(queues)s::text[], %(tasks)s::text[], %(args)s::text[], %(kwargs)s::text[],
                %(priorities)s::integer[], %(run_ats)s::timestamptz[],
                %(max_attempts)s::integer[], %(keys)s::text[], %(groups)s::text[],
                %(batches)s::text[])
         WITH ORDINALITY AS i (queue, task, args, kwargs, priority, run_at, max_attempts,
                               key, group_key, batch, ord)
),
inserted AS (
    INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                      key, group_key, batch, created_at)
    OVERRIDING SYSTEM VALUE
    SELECT id, queue, task, args::jsonb, kwargs::jsonb, priority, run_at, max_attempts,
           key, group_key, batch, %(now)s::timestamptz
    FROM input
    ORDER BY ord
    ON CONFLICT (queue, key) WHERE key IS NOT NULL AND state IN ('queued', 'running')
    DO NOTHING
    RETURNING id, queue, task, created_at
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, at)
    SELECT id, queue, task, 'enqueued', 0, created_at FROM inserted ORDER BY id
),
notified AS (
    SELECT count(pg_notify('conveyor_jobs', q)) AS n
    FROM (SELECT DISTINCT queue AS q FROM inserted) AS d
)
SELECT input.id, inserted.id IS NOT NULL
FROM input LEFT JOIN inserted ON inserted.id = input.id CROSS JOIN notified
ORDER BY input.ord

-- name: job_find_keys
-- Every job holding one of the (queue, key) pairs, newest first.
SELECT * FROM jobs
WHERE key IS NOT NULL
  AND (queue, key) IN (SELECT * FROM unnest(%(queues)s::text[], %(keys)s::text[]))
ORDER BY id DESC

-- name: job_get
SELECT * FROM jobs WHERE id = %(id)s::bigint

-- name: job_get_many
SELECT * FROM jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: job_list
SELECT * FROM jobs
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(task)s::text IS NULL OR task = %(task)s::text)
  AND (%(batch)s::text IS NULL OR batch = %(batch)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s::bigint

-- name: job_claim
-- Each queue is searched on its own (the lateral subquery walks the jobs_queued
-- index of one queue in claim order and stops at the limit); the best of those
-- candidates win. A single "queue = ANY(...) ORDER BY" would sort every queued
-- job of those queues on each claim. SKIP LOCKED makes concurrent claimers
-- pass over each other's candidates instead of waiting for them.
--
-- A job in a group is claimable only when it is its group's oldest queued job
-- and no job of the group is running; the unique index jobs_group_running
-- backs this up when concurrent claimers see different snapshots.
WITH candidates AS (
    SELECT c.id, c.priority
    FROM (SELECT DISTINCT name FROM unnest(%(queues)s::text[]) AS u (name)) AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority FROM jobs AS j
        WHERE j.state = 'queued'
          AND j.queue = q.name
          AND j.run_at <= %(now)s::timestamptz
          AND (%(group)s::text IS NULL OR j.group_key = %(group)s::text)
          AND (j.group_key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM jobs AS r
                          WHERE r.group_key = j.group_key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs AS o
                              WHERE o.group_key = j.group_key AND o.state = 'queued'
                                AND o.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT %(limit)s::bigint
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
    WHERE q.name NOT IN (SELECT name FROM queues WHERE paused)
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s::bigint
),
claimed AS (
    UPDATE jobs
    SET state = 'running',
        attempts = jobs.attempts + 1,
        worker = %(worker)s::text,
        lease_token = %(token)s::text,
        lease_expires_at = %(lease_expires_at)s::timestamptz,
        started_at = %(now)s::timestamptz,
        progress = NULL,
        progress_message = NULL
    FROM candidates
    WHERE jobs.id = candidates.id AND jobs.state = 'queued'
    RETURNING jobs.*
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, 'claimed', attempts, worker, %(now)s::timestamptz
    FROM claimed ORDER BY id
)
SELECT * FROM claimed

-- name: job_heartbeat
UPDATE jobs
SET lease_expires_at = %(lease_expires_at)s::timestamptz
FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS l (id, token)
WHERE jobs.id = l.id
  AND jobs.lease_token = l.token
  AND jobs.state = 'running'
RETURNING jobs.id, jobs.cancel_requested

-- name: job_complete
WITH changed AS (
    UPDATE jobs
    SET state = 'succeeded',
        result = c.result::jsonb,
        finished_at = %(now)s::timestamptz,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[], %(results)s::text[])
         AS c (id, token, result)
    WHERE jobs.id = c.id
      AND jobs.lease_token = c.token
      AND jobs.state = 'running'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker, %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL ORDER BY id
),
notified AS (
    SELECT count(pg_notify('conveyor_done', id::text)) AS n FROM changed
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_fail
-- A job whose cancel was requested ends cancelled rather than retrying.
WITH changed AS (
    UPDATE jobs
    SET state = CASE
            WHEN jobs.cancel_requested THEN 'cancelled'
            WHEN f.retryable AND jobs.attempts < jobs.max_attempts THEN 'queued'
            ELSE 'failed' END,
        run_at = CASE
            WHEN NOT jobs.cancel_requested AND f.retryable AND jobs.attempts < jobs.max_attempts
            THEN f.retry_at ELSE jobs.run_at END,
        finished_at = CASE
            WHEN NOT jobs.cancel_requested AND f.retryable AND jobs.attempts < jobs.max_attempts
            THEN NULL ELSE %(now)s::timestamptz END,
        error = f.error,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[], %(errors)s::text[],
                %(retryables)s::boolean[], %(retry_ats)s::timestamptz[])
         AS f (id, token, error, retryable, retry_at)
    WHERE jobs.id = f.id
      AND jobs.lease_token = f.token
      AND jobs.state = 'running'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker, jobs.error
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker,
           %(now)s::timestamptz, error
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL ORDER BY id
),
notified AS (
    SELECT count(pg_notify(n.channel, n.payload)) AS n
    FROM (SELECT DISTINCT 'conveyor_jobs' AS channel, queue AS payload
          FROM changed WHERE state = 'queued'
          UNION ALL
          SELECT 'conveyor_done', id::text FROM changed WHERE state <> 'queued') AS n
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_snooze
-- Gives the attempt back: a snooze is not a failure. The event names the
-- attempt that ran (attempts + 1 after the decrement).
WITH changed AS (
    UPDATE jobs
    SET state = CASE WHEN jobs.cancel_requested THEN 'cancelled' ELSE 'queued' END,
        run_at = s.run_at,
        attempts = jobs.attempts - 1,
        finished_at = CASE WHEN jobs.cancel_requested THEN %(now)s::timestamptz END,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[], %(run_ats)s::timestamptz[])
         AS s (id, token, run_at)
    WHERE jobs.id = s.id
      AND jobs.lease_token = s.token
      AND jobs.state = 'running'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts + 1, worker,
           %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL ORDER BY id
),
notified AS (
    SELECT count(pg_notify(n.channel, n.payload)) AS n
    FROM (SELECT DISTINCT 'conveyor_jobs' AS channel, queue AS payload
          FROM changed WHERE state = 'queued'
          UNION ALL
          SELECT 'conveyor_done', id::text FROM changed WHERE state <> 'queued') AS n
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_release
-- Shutdown hands the job back without using up an attempt.
WITH changed AS (
    UPDATE jobs
    SET state = CASE WHEN jobs.cancel_requested THEN 'cancelled' ELSE 'queued' END,
        attempts = jobs.attempts - 1,
        finished_at = CASE WHEN jobs.cancel_requested THEN %(now)s::timestamptz END,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS r (id, token)
    WHERE jobs.id = r.id
      AND jobs.lease_token = r.token
      AND jobs.state = 'running'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts + 1, worker,
           %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL ORDER BY id
),
notified AS (
    SELECT count(pg_notify(n.channel, n.payload)) AS n
    FROM (SELECT DISTINCT 'conveyor_jobs' AS channel, queue AS payload
          FROM changed WHERE state = 'queued'
          UNION ALL
          SELECT 'conveyor_done', id::text FROM changed WHERE state <> 'queued') AS n
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_set_cancelled
WITH changed AS (
    UPDATE jobs
    SET state = 'cancelled',
        finished_at = %(now)s::timestamptz,
        lease_token = NULL,
        lease_expires_at = NULL
    FROM unnest(%(ids)s::bigint[], %(tokens)s::text[]) AS c (id, token)
    WHERE jobs.id = c.id
      AND jobs.lease_token = c.token
      AND jobs.state = 'running'
    RETURNING jobs.id, jobs.queue, jobs.task, jobs.state, jobs.attempts, jobs.worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker, %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL ORDER BY id
),
notified AS (
    SELECT count(pg_notify('conveyor_done', id::text)) AS n FROM changed
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_progress
UPDATE jobs
SET progress = coalesce(%(fraction)s::double precision, progress),
    progress_message = %(message)s::text
WHERE id = %(id)s::bigint AND lease_token = %(token)s::text AND state = 'running'

-- name: job_rescue_expired
-- The lease check is repeated on the row being updated: PostgreSQL re-evaluates
-- it on the newest row version once the row is locked, so a worker that renewed
-- or finished in the meantime wins entirely (the compare-and-set). Every rescue
-- records "rescued"; one that ends the job also records how it ended, after
-- all the "rescued" events (the order SQLite writes them in).
WITH changed AS (
    UPDATE jobs
    SET state = CASE
            WHEN cancel_requested THEN 'cancelled'
            WHEN attempts < max_attempts THEN 'queued'
            ELSE 'failed' END,
        finished_at = CASE
            WHEN NOT cancel_requested AND attempts < max_attempts
            THEN NULL ELSE %(now)s::timestamptz END,
        run_at = %(now)s::timestamptz,
        error = 'worker lost: lease expired',
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE id IN (SELECT id FROM jobs
                 WHERE state = 'running' AND lease_expires_at < %(now)s::timestamptz
                 ORDER BY lease_expires_at
                 LIMIT %(limit)s::bigint
                 FOR UPDATE SKIP LOCKED)
      AND state = 'running' AND lease_expires_at < %(now)s::timestamptz
    RETURNING id, queue, task, state, attempts, worker, error
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at, error)
    SELECT c.id, c.queue, c.task, k.kind, c.attempts, c.worker, %(now)s::timestamptz, c.error
    FROM changed AS c
    CROSS JOIN LATERAL (VALUES (1, %(kinds)s::jsonb ->> c.state),
                               (2, %(endings)s::jsonb ->> c.state)) AS k (pass, kind)
    WHERE k.kind IS NOT NULL
    ORDER BY k.pass, c.id
),
notified AS (
    SELECT count(pg_notify(n.channel, n.payload)) AS n
    FROM (SELECT DISTINCT 'conveyor_jobs' AS channel, queue AS payload
          FROM changed WHERE state = 'queued'
          UNION ALL
          SELECT 'conveyor_done', id::text FROM changed WHERE state <> 'queued') AS n
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_cancel_queued
WITH changed AS (
    UPDATE jobs
    SET state = 'cancelled', finished_at = %(now)s::timestamptz
    WHERE id = %(id)s::bigint AND state = 'queued'
    RETURNING id, queue, task, state, attempts, worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker, %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL
),
notified AS (
    SELECT count(pg_notify('conveyor_done', id::text)) AS n FROM changed
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_cancel_running
-- Only flags the job: the worker running it sees the flag (in its heartbeat
-- answer, or at once through conveyor_cancel), aborts and records cancelled.
WITH changed AS (
    UPDATE jobs
    SET cancel_requested = true
    WHERE id = %(id)s::bigint AND state = 'running' AND NOT cancel_requested
    RETURNING id, queue, task, state, attempts, worker
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker, %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL
),
notified AS (
    SELECT count(pg_notify('conveyor_cancel', id::text)) AS n FROM changed
)
SELECT changed.id FROM changed CROSS JOIN notified

-- name: job_retry
-- Manual retry of a failed or cancelled job, unless another live job now holds
-- its key (a producer racing this statement makes it fail on jobs_live_key,
-- which the store reports the same way).
WITH changed AS (
    UPDATE jobs
    SET state = 'queued',
        attempts = 0,
        run_at = %(now)s::timestamptz,
        cancel_requested = false,
        worker = NULL,
        result = NULL,
        error = NULL,
        progress = NULL,
        progress_message = NULL,
        started_at = NULL,
        finished_at = NULL
    WHERE id = %(id)s::bigint AND state IN ('failed', 'cancelled')
      AND (key IS NULL OR NOT EXISTS (
          SELECT 1 FROM jobs AS other
          WHERE other.queue = jobs.queue AND other.key = jobs.key
            AND other.state IN ('queued', 'running')))
    RETURNING jobs.*
),
ev AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, %(kinds)s::jsonb ->> state, attempts, worker, %(now)s::timestamptz
    FROM changed WHERE (%(kinds)s::jsonb ->> state) IS NOT NULL
),
notified AS (
    SELECT count(pg_notify('conveyor_jobs', queue)) AS n FROM changed
)
SELECT changed.* FROM changed CROSS JOIN notified

-- name: job_purge
-- Terminal jobs finished before the cutoff, oldest first, with their events.
-- Rows another transaction holds (e.g. a manual retry) are left for next time.
WITH doomed AS (
    SELECT id FROM jobs
    WHERE finished_at < %(before)s::timestamptz
      AND state IN ('succeeded', 'failed', 'cancelled')
    ORDER BY finished_at
    LIMIT %(limit)s::bigint
    FOR UPDATE SKIP LOCKED
),
gone_events AS (
    DELETE FROM events WHERE job_id IN (SELECT id FROM doomed)
),
gone AS (
    DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) RETURNING id
)
SELECT count(*) FROM gone

-- name: event_list
SELECT seq, job_id, queue, task, kind, attempt, worker, at, error
FROM events WHERE job_id = %(job_id)s::bigint ORDER BY seq

-- name: event_since
SELECT seq, job_id, queue, task, kind, attempt, worker, at, error
FROM events WHERE seq > %(seq)s::bigint ORDER BY seq LIMIT %(limit)s::bigint

-- name: stats
-- One statement, so every figure describes the same snapshot. Rows:
-- ('count', queue, state, n, oldest ready run_at of that queue and state),
-- ('paused', queue, ...) and ('finished', ..., n).
SELECT 'count' AS what, queue, state, count(*) AS n,
       min(run_at) FILTER (WHERE state = 'queued' AND run_at <= %(now)s::timestamptz)
FROM jobs GROUP BY queue, state
UNION ALL
SELECT 'paused', name, NULL, NULL, NULL FROM queues WHERE paused
UNION ALL
SELECT 'finished', NULL, NULL, count(*), NULL FROM jobs
WHERE finished_at >= %(since)s::timestamptz

-- name: next_run_at
SELECT min(run_at) FROM jobs
WHERE state = 'queued'
  AND (%(all_queues)s::boolean OR queue = ANY(%(queues)s::text[]))

-- name: queue_set_paused
INSERT INTO queues (name, paused, updated_at)
VALUES (%(name)s::text, %(paused)s::boolean, %(now)s::timestamptz)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at

-- name: queue_list
SELECT name, paused FROM queues

-- name: worker_register
INSERT INTO workers (id, host, pid, queues, concurrency, jobs_in_hand, started_at, last_seen_at)
VALUES (%(id)s::text, %(host)s::text, %(pid)s::integer, %(queues)s::text[],
        %(concurrency)s::integer, 0, %(now)s::timestamptz, %(now)s::timestamptz)
ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at

-- name: worker_beat
UPDATE workers SET last_seen_at = %(now)s::timestamptz, jobs_in_hand = %(jobs_in_hand)s::integer
WHERE id = %(id)s::text

-- name: worker_unregister
DELETE FROM workers WHERE id = %(id)s::text

-- name: worker_list
SELECT id, host, pid, queues, concurrency, jobs_in_hand, started_at, last_seen_at
FROM workers ORDER BY started_at, id

-- name: worker_prune
DELETE FROM workers WHERE last_seen_at < %(before)s::timestamptz

-- name: leader_acquire
-- Take the lease when it is free or expired, or renew it when it is ours.
INSERT INTO leaders (name, holder, expires_at)
VALUES (%(name)s::text, %(holder)s::text, %(expires_at)s::timestamptz)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE leaders.holder = excluded.holder OR leaders.expires_at < %(now)s::timestamptz
RETURNING holder

-- name: leader_release
DELETE FROM leaders WHERE name = %(name)s::text AND holder = %(holder)s::text
