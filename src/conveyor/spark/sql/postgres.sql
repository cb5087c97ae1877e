-- Statements of the Spark data source on PostgreSQL. ``{stage}``, ``{stages}``
-- and ``{columns}`` are filled in by Python with identifiers it made itself
-- (never user text): table and column names cannot be parameters.

-- name: write_open
INSERT INTO spark_writes (id, started_at) VALUES (%(id)s, %(now)s)

-- name: write_is_open
-- FOR SHARE: a commit or abort (which deletes the row) waits for the task's
-- transaction to end, and a task that comes after it finds no row.
SELECT 1 FROM spark_writes WHERE id = %(id)s FOR SHARE

-- name: write_close
DELETE FROM spark_writes WHERE id = %(id)s

-- name: write_abandoned
-- Writes opened before %(before)s and never ended: their driver died between
-- opening the write and its commit or abort.
SELECT id FROM spark_writes WHERE started_at < %(before)s

-- name: stage_tables
SELECT tablename FROM pg_tables
WHERE schemaname = current_schema() AND tablename LIKE %(prefix)s || '%%'

-- name: stage_create
-- Unlogged: staged rows need no crash safety (a crash fails the write), and
-- skipping the WAL makes the COPY about twice as fast.
CREATE UNLOGGED TABLE IF NOT EXISTS {stage} (
    ord          bigint  GENERATED ALWAYS AS IDENTITY,
    queue        text    NOT NULL,
    task         text    NOT NULL,
    args         text    NOT NULL,
    kwargs       text    NOT NULL,
    priority     integer NOT NULL,
    run_at       double precision,
    max_attempts integer NOT NULL,
    key          text,
    group_key    text,
    batch        text
)

-- name: stage_copy
COPY {stage} (queue, task, args, kwargs, priority, run_at, max_attempts, key, group_key, batch)
FROM STDIN (FORMAT csv)

-- name: stage_drop
DROP TABLE IF EXISTS {stage}

-- name: stage_part
SELECT {part} AS part, * FROM {stage}

-- name: stage_move
-- Ids come from the jobs identity sequence in staging order (partition, then
-- row), as the store's own job_insert draws them. Rows are inserted in key
-- order so that two writers with the same keys never deadlock; a row whose key
-- a live job holds is skipped by ON CONFLICT (the first row of a key in the
-- write wins), and with unique = 'forever' any job that ever held the key
-- skips it. Events and the wake-up of workers happen in the same statement.
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('jobs', 'id'))::regclass) AS id, s.*
    FROM (SELECT * FROM ({stages}) AS u ORDER BY part, ord) AS s
), new AS (
    INSERT INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                      key, group_key, batch, created_at)
    SELECT id, queue, task, args::json, kwargs::json, priority,
           coalesce(to_timestamp(run_at), %(now)s), max_attempts, key, group_key, batch,
           %(now)s
    FROM input AS i
    WHERE i.key IS NULL
       OR %(unique)s = 'live'
       OR NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.queue = i.queue AND j.key = i.key)
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
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM input), (SELECT n FROM notified)

-- name: id_bounds
SELECT min({id}), max({id}) FROM {table}

-- name: read_range
COPY (SELECT {columns} FROM {table} WHERE {where} ORDER BY {id}) TO STDOUT (FORMAT csv)

-- name: stream_latest
-- Events are ordered by (xid, seq), not by seq alone: a transaction can commit
-- a lower seq after a higher one was read. Every transaction below the oldest
-- one still running (the snapshot's xmin) has ended, so the events below it
-- are final, and a stream that hands out only those never skips a late one.
-- Computed in one statement, so the events read and the xmin come from the
-- same snapshot.
SELECT e.xid::text::bigint, e.seq
FROM events AS e
WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
  AND (e.xid, e.seq) > (%(xid)s::text::xid8, %(seq)s)
ORDER BY e.xid DESC, e.seq DESC
LIMIT 1

-- name: stream_latest_limited
-- The end of a micro-batch of at most %(limit)s events.
SELECT l.xid::text::bigint, l.seq
FROM (SELECT e.xid, e.seq FROM events AS e
      WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
        AND (e.xid, e.seq) > (%(xid)s::text::xid8, %(seq)s)
      ORDER BY e.xid, e.seq
      LIMIT %(limit)s) AS l
ORDER BY l.xid DESC, l.seq DESC
LIMIT 1

-- name: stream_read
SELECT {columns} FROM events
WHERE (xid, seq) > (%(after_xid)s::text::xid8, %(after_seq)s)
  AND (xid, seq) <= (%(until_xid)s::text::xid8, %(until_seq)s)
ORDER BY seq
