-- Named statements of the Spark layer's storage on SQLite (conveyor.spark.storage.sqlite):
-- its writes, the staging of their rows, its scans and the event stream. Times
-- are REAL epoch seconds, as in the store. ``{stage}``, ``{columns}``,
-- ``{table}``, ``{where}`` and ``{id}`` are filled in by Python with
-- identifiers and SQL fragments the storage makes itself, never user text:
-- table and column names cannot be parameters.
--
-- A move of staged rows follows the rules of every enqueue with the store's own
-- statements, included from its queries.sql: ids from job_take_ids, events
-- from event_insert_enqueued; the live key is refused by the jobs_live_key index.

-- with: conveyor.spark.storage/shared.sql

-- name: spark_migrations_table
-- The migration line of Spark's tables (migrations/sqlite/), apart from the
-- store's schema_migrations. A database that never ran a Spark write has none of
-- Spark's tables, this one included.
CREATE TABLE IF NOT EXISTS spark_schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)

-- name: spark_migrations_exist
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'spark_schema_migrations'

-- name: spark_migration_record
INSERT INTO spark_schema_migrations (version, name, applied_at) VALUES (:version, :name, :now)

-- name: spark_take_ids
-- The ids of a move, reserved as every enqueue reserves them.
{{conveyor.store.sqlite/queries.sql:job_take_ids}}

-- name: spark_insert_enqueued_events
-- The enqueued events of the jobs a move inserted, as every enqueue writes them.
{{conveyor.store.sqlite/queries.sql:event_insert_enqueued}}

-- name: spark_write_is_open
SELECT 1 FROM spark_writes WHERE id = :id

-- name: spark_stage_tables
-- Every staging table of a write, including those of failed or duplicate task
-- attempts, which the driver never hears about.
SELECT name FROM sqlite_master
WHERE type = 'table' AND substr(name, 1, length(:prefix)) = :prefix

-- name: spark_stage_create
CREATE TABLE IF NOT EXISTS {stage} (
{{spark_stage_columns}}
)

-- name: spark_direct_create
-- A non-atomic write moves each batch into jobs in the transaction that stages
-- it: a temporary table of the connection, emptied after each move.
CREATE TEMPORARY TABLE IF NOT EXISTS {stage} (
{{spark_stage_columns}}
)

-- name: spark_direct_clear
DELETE FROM {stage}

-- name: spark_stage_insert
INSERT INTO {stage} (queue, task, args, kwargs, priority, run_at, max_attempts, key,
                     group_key, batch)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: spark_stage_count
-- Staging tables are only appended to, so rowids run 1..n without gaps.
SELECT coalesce(max(rowid), 0) FROM {stage}

-- name: spark_stage_drop_held_keys
-- unique = 'forever': a staged row whose key any job of its queue holds, live or
-- finished, is left out before the move.
DELETE FROM {stage}
WHERE key IS NOT NULL
  AND EXISTS (SELECT 1 FROM jobs AS j WHERE j.queue = {stage}.queue AND j.key = {stage}.key)

-- name: spark_stage_move
-- Ids :first .. :first + n - 1 were reserved (spark_take_ids) under this same write
-- lock, in staging order, so jobs keep the DataFrame's order within a partition.
-- A row whose key a live job holds is skipped by OR IGNORE on jobs_live_key (the
-- first row of a key in the write wins) and leaves its id unused.
INSERT OR IGNORE INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                            key, group_key, batch, created_at)
SELECT :first + s.rowid - 1, s.queue, s.task, s.args, s.kwargs, s.priority,
       coalesce(s.run_at, :now), s.max_attempts, s.key, s.group_key, s.batch, :now
FROM {stage} AS s
ORDER BY s.rowid

-- name: spark_progress_advance
INSERT INTO spark_write_progress (write_id, part, row_count, checksum, enqueued, skipped)
VALUES (:write_id, :part, :row_count, :checksum, :enqueued, :skipped)
ON CONFLICT (write_id, part) DO UPDATE
SET row_count = excluded.row_count,
    checksum = excluded.checksum,
    enqueued = spark_write_progress.enqueued + excluded.enqueued,
    skipped = spark_write_progress.skipped + excluded.skipped

-- name: scan_range
SELECT {columns} FROM {table} WHERE {where} ORDER BY {id}

-- name: event_stream_latest
SELECT coalesce(max(seq), 0) FROM events

-- name: event_stream_latest_limited
-- The seq that ends a micro-batch of at most :limit events after :after.
SELECT max(seq) FROM (SELECT seq FROM events WHERE seq > :after ORDER BY seq LIMIT :limit)

-- name: event_stream_read
-- SQLite has one writer, so seqs commit in order: every event up to a seq
-- that was read once is final.
SELECT {columns} FROM events WHERE seq > :after AND seq <= :until ORDER BY seq

-- name: spark_stage_columns
-- The columns of a staging table, permanent or temporary (included above).
    queue        TEXT    NOT NULL,
    task         TEXT    NOT NULL,
    args         TEXT    NOT NULL,
    kwargs       TEXT    NOT NULL,
    priority     INTEGER NOT NULL,
    run_at       REAL,
    max_attempts INTEGER NOT NULL,
    key          TEXT,
    group_key    TEXT,
    batch        TEXT
