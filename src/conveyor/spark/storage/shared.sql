-- The Spark layer's statements that read the same in both SQL dialects, written
-- once; sqlite.sql and postgres.sql start from this file (their "-- with:"
-- line, see conveyor.store.sql) and add what differs. Placeholders are :name.

-- name: spark_schema_version
SELECT coalesce(max(version), 0) FROM spark_schema_migrations

-- name: spark_write_open
-- A write in progress. Its tasks stage rows only while this row exists.
-- result_id: the caller's writeId (what `conveyor spark writes` shows).
INSERT INTO spark_writes (id, started_at, result_id) VALUES (:id, :now, :result_id)

-- name: spark_write_touch
-- A streaming micro-batch is opened by its own tasks (the sink has no hook before
-- them), and kept fresh so that it is never taken for abandoned.
INSERT INTO spark_writes (id, started_at) VALUES (:id, :now)
ON CONFLICT (id) DO UPDATE SET started_at = excluded.started_at

-- name: spark_write_close
DELETE FROM spark_writes WHERE id = :id

-- name: spark_write_abandoned
-- Writes opened before :before and never ended: their driver died between
-- opening the write and its commit or abort.
-- Returns each one's id and the caller's id of it (else its own).
SELECT id, coalesce(result_id, id) FROM spark_writes WHERE started_at < :before

-- name: spark_stage_drop
DROP TABLE IF EXISTS {stage}

-- name: spark_write_result_get
SELECT id, batch, committed_at, row_count, enqueued, skipped, keyless, path
FROM spark_write_results WHERE id = :id

-- name: spark_write_result_record
-- A write's counts and how it committed; a stream's row adds up its
-- micro-batches and names the last.
INSERT INTO spark_write_results
    (id, batch, committed_at, row_count, enqueued, skipped, keyless, path)
VALUES (:id, :batch, :now, :row_count, :enqueued, :skipped, :keyless, :path)
ON CONFLICT (id) DO UPDATE
SET batch = excluded.batch,
    committed_at = excluded.committed_at,
    row_count = spark_write_results.row_count + excluded.row_count,
    enqueued = spark_write_results.enqueued + excluded.enqueued,
    skipped = spark_write_results.skipped + excluded.skipped,
    keyless = spark_write_results.keyless + excluded.keyless,
    path = excluded.path

-- name: spark_progress_get
SELECT row_count, checksum FROM spark_write_progress
WHERE write_id = :write_id AND part = :part

-- name: spark_progress_totals
SELECT coalesce(sum(row_count), 0), coalesce(sum(enqueued), 0), coalesce(sum(skipped), 0)
FROM spark_write_progress WHERE write_id = :write_id

-- name: spark_progress_delete
DELETE FROM spark_write_progress WHERE write_id = :write_id

-- name: scan_id_bounds
SELECT min({id}), max({id}) FROM {table}

-- name: event_first_seq_since
-- Where a stream that starts at a time begins: the first event recorded then or
-- later (a scan of the events table, once, when the query first starts).
SELECT min(seq) FROM events WHERE at >= :at
