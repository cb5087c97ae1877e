-- Named statements of the Spark layer's storage on PostgreSQL
-- (conveyor.spark.storage.postgres): its writes, the staging of their rows, its
-- scans and the event stream. ``%(now)s`` is always passed in, as in the store.
-- ``{stage}``, ``{stages}``, ``{columns}``, ``{table}``, ``{where}`` and ``{id}``
-- are filled in by Python with identifiers and SQL fragments the storage makes
-- itself, never user text: table and column names cannot be parameters.
--
-- A move of staged rows ends with the store's job_insert_rules, included from
-- its queries.sql: keys, events and the wake-up of workers follow one rule.

-- with: conveyor.spark.storage/shared.sql as pyformat

-- name: spark_migrations_lock
-- Held until the transaction ends: concurrent first writes apply each file once.
-- A key of its own: the store's migrations take another.
SELECT pg_advisory_xact_lock(7245019)

-- name: spark_migrations_table
-- The migration line of Spark's tables (migrations/postgres/), apart from the
-- store's schema_migrations. A database that never ran a Spark write has none of
-- Spark's tables, this one included.
CREATE TABLE IF NOT EXISTS spark_schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL
)

-- name: spark_migrations_exist
SELECT to_regclass('spark_schema_migrations') IS NOT NULL

-- name: spark_migration_record
INSERT INTO spark_schema_migrations (version, name, applied_at)
VALUES (%(version)s, %(name)s, %(now)s)

-- name: spark_write_is_open
-- FOR SHARE: a commit or abort (which deletes the row) waits for the task's
-- transaction to end, and a task that comes after it finds no row.
SELECT 1 FROM spark_writes WHERE id = %(id)s FOR SHARE

-- name: spark_stage_tables
-- Every staging table of a write, including those of failed or duplicate task
-- attempts, which the driver never hears about.
SELECT tablename FROM pg_tables
WHERE schemaname = current_schema() AND starts_with(tablename, %(prefix)s)

-- name: spark_stage_create
-- Unlogged: staged rows need no crash safety (a crash fails the write), and
-- skipping the WAL makes the COPY about twice as fast.
CREATE UNLOGGED TABLE IF NOT EXISTS {stage} (
{{spark_stage_columns}}
)

-- name: spark_direct_create
-- A non-atomic write moves each batch into jobs in the transaction that stages
-- it: a temporary table of the connection, emptied at every commit.
CREATE TEMPORARY TABLE IF NOT EXISTS {stage} (
{{spark_stage_columns}}
) ON COMMIT DELETE ROWS

-- name: spark_stage_copy
COPY {stage} (queue, task, args, kwargs, priority, run_at, max_attempts, key, group_key, batch)
FROM STDIN (FORMAT csv)

-- name: spark_stage_count
SELECT count(*) FROM {stage}

-- name: spark_stage_part
SELECT {part} AS part, * FROM {stage}

-- name: spark_stage_drop_held_keys
-- unique = 'forever': a staged row whose key any job of its queue holds, live or
-- finished, is left out before the move.
DELETE FROM {stage} AS s USING jobs AS j
WHERE s.key IS NOT NULL AND j.queue = s.queue AND j.key = s.key

-- name: spark_stage_move
-- The staged rows into jobs by the rules of every enqueue (the store's
-- job_insert_rules, included), in one transaction. Returns (jobs inserted, rows
-- given).
WITH {{spark_moved_rows}}
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM input) FROM notified

-- name: spark_piece_move
-- A piece of a parallel commit (conveyor.spark.storage.pieces): its share of the
-- staged rows into jobs, as spark_stage_move, in a transaction that is then
-- prepared. A prepared transaction cannot NOTIFY, so notified is not read (and
-- so not run); the queues of the new jobs come back instead, for a notification
-- once the piece is committed. Returns (jobs inserted, rows given, queues).
WITH {{spark_moved_rows}}
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM input),
       (SELECT coalesce(array_agg(DISTINCT queue), ARRAY[]::text[]) FROM new)

-- name: spark_moved_rows
-- The rows of a move: every staged row when %(pieces)s is 1, else piece
-- %(piece)s of %(pieces)s, where the rows of one key (queue and key) are always
-- in the same piece, so that the pieces of a write never wait for each other's
-- keys, and keyless rows stay with their partition. Ids come from the jobs
-- identity sequence in staging order (partition, then row) within a piece, as
-- job_insert draws them.
input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('jobs', 'id'))::regclass) AS id,
           s.queue, s.task, s.args::json AS args, s.kwargs::json AS kwargs, s.priority,
           coalesce(to_timestamp(s.run_at), %(now)s) AS run_at, s.max_attempts, s.key,
           s.group_key, s.batch, NULL::text AS limit_key, NULL::json AS headers
    FROM (SELECT * FROM ({stages}) AS u
          WHERE %(pieces)s = 1
             OR (CASE WHEN u.key IS NULL THEN u.part
                      ELSE hashtext(u.queue || ':' || u.key) & 2147483647
                 END) %% %(pieces)s = %(piece)s
          ORDER BY part, ord) AS s
),
{{conveyor.store.postgres/queries.sql:job_insert_rules}}

-- name: spark_prepared_room
-- How many more transactions the server lets be prepared at once: a parallel
-- commit needs one per piece (max_prepared_transactions is 0 by default).
SELECT current_setting('max_prepared_transactions')::int - (SELECT count(*) FROM pg_prepared_xacts)

-- name: spark_prepared_pieces
-- The pieces prepared and not yet committed or rolled back, of the writes of this
-- schema, each with its write's token (conveyor.spark.storage.pieces._gid names
-- them: conveyor_spark:<token>:<piece>:<schema>).
SELECT p.gid, split_part(p.gid, ':', 2)
FROM pg_prepared_xacts AS p
WHERE p.database = current_database()
  AND starts_with(p.gid, 'conveyor_spark:')
  AND substr(p.gid, length(split_part(p.gid, ':', 1) || split_part(p.gid, ':', 2)
                           || split_part(p.gid, ':', 3)) + 4) = current_schema()

-- name: spark_current_schema
SELECT current_schema()

-- name: spark_piece_lock_timeout
-- How long a piece waits for a key another transaction holds (its transaction only).
SELECT set_config('lock_timeout', %(timeout)s, true)

-- name: spark_committer_lock
-- Held by a parallel commit's committer from before its first piece until its
-- last is committed or rolled back, on its session: when a settle can take it,
-- the committer has ended or died, and its leftover pieces are the settle's.
SELECT pg_advisory_lock({{spark_committer_key}})

-- name: spark_committer_key
-- The advisory lock key of a write's committer (its token, in this schema).
hashtextextended('conveyor_spark:' || current_schema() || ':' || %(token)s, 0)

-- name: spark_turn_key
-- The advisory lock key of the parallel commits' turn in this schema.
hashtextextended('conveyor_spark:' || current_schema(), 0)

-- name: spark_commit_turn
-- Parallel commits of a schema take turns (their staging does not): the pieces
-- of two writes could otherwise each wait for a key in the other's prepared
-- piece, a wait PostgreSQL's deadlock detector cannot see, until both time out.
SELECT pg_advisory_lock({{spark_turn_key}})

-- name: spark_commit_turn_end
SELECT pg_advisory_unlock({{spark_turn_key}})

-- name: spark_committer_try_lock
SELECT pg_try_advisory_lock({{spark_committer_key}})

-- name: spark_committer_unlock
SELECT pg_advisory_unlock({{spark_committer_key}})

-- name: spark_commit_decide
-- The decision of a parallel commit, in the transaction that closes the write and
-- records its result: once this row is committed, so is every piece.
INSERT INTO spark_commits (token, decided_at) VALUES (%(token)s, %(now)s)

-- name: spark_commit_decisions
SELECT token FROM spark_commits

-- name: spark_commit_forget
-- Every piece is committed and the staging dropped: the decision is not needed.
DELETE FROM spark_commits WHERE token = %(token)s

-- name: spark_notify
-- Wakes the workers of the queues a committed piece added jobs to.
WITH changed AS (SELECT unnest(%(queues)s::text[]) AS queue)
{{conveyor.store.postgres/queries.sql:notify_queues}}

-- name: spark_write_result_lock
-- Held until the commit ends: one committer at a time per result.
SELECT batch FROM spark_write_results WHERE id = %(id)s FOR UPDATE

-- name: spark_progress_claim
-- Makes sure the partition's row exists, so that the FOR UPDATE below always
-- has a row to lock: two attempts of one partition take turns.
INSERT INTO spark_write_progress (write_id, part, row_count, checksum, enqueued, skipped)
VALUES (%(write_id)s, %(part)s, 0, 0, 0, 0)
ON CONFLICT (write_id, part) DO NOTHING

-- name: spark_progress_lock
SELECT row_count, checksum FROM spark_write_progress
WHERE write_id = %(write_id)s AND part = %(part)s
FOR UPDATE

-- name: spark_progress_advance
UPDATE spark_write_progress
SET row_count = %(row_count)s,
    checksum = %(checksum)s,
    enqueued = enqueued + %(enqueued)s,
    skipped = skipped + %(skipped)s
WHERE write_id = %(write_id)s AND part = %(part)s

-- name: scan_range
COPY (SELECT {columns} FROM {table} WHERE {where} ORDER BY {id}) TO STDOUT (FORMAT csv)

-- name: event_stream_latest
-- Events are ordered by (xid, seq), not by seq alone: a transaction can commit
-- a lower seq after a higher one was read. Every transaction below the oldest
-- one still running (the snapshot's xmin) has ended, so the events below it
-- are final, and a stream that hands out only those never skips a late one.
-- Computed in one statement, so the events read and the xmin come from the
-- same snapshot. Events below seq %(floor)s are not part of the stream.
SELECT e.xid::text::bigint, e.seq
FROM events AS e
WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
  AND (e.xid, e.seq) > (%(xid)s::text::xid8, %(seq)s)
  AND e.seq >= %(floor)s
ORDER BY e.xid DESC, e.seq DESC
LIMIT 1

-- name: event_stream_latest_limited
-- The end of a micro-batch of at most %(limit)s events.
SELECT l.xid::text::bigint, l.seq
FROM (SELECT e.xid, e.seq FROM events AS e
      WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
        AND (e.xid, e.seq) > (%(xid)s::text::xid8, %(seq)s)
        AND e.seq >= %(floor)s
      ORDER BY e.xid, e.seq
      LIMIT %(limit)s) AS l
ORDER BY l.xid DESC, l.seq DESC
LIMIT 1

-- name: event_stream_read
SELECT {columns} FROM events
WHERE (xid, seq) > (%(after_xid)s::text::xid8, %(after_seq)s)
  AND (xid, seq) <= (%(until_xid)s::text::xid8, %(until_seq)s)
  AND seq >= %(floor)s
ORDER BY seq

-- name: spark_stage_columns
-- The columns of a staging table, permanent or temporary (included above).
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
