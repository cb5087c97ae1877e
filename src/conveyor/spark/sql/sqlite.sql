-- Statements of the Spark data source on SQLite. ``{stage}`` and ``{columns}``
-- are filled in by Python with identifiers it made itself (never user text):
-- table and column names cannot be parameters.

-- name: write_open
INSERT INTO spark_writes (id, started_at) VALUES (:id, :now)

-- name: write_is_open
SELECT 1 FROM spark_writes WHERE id = :id

-- name: write_close
DELETE FROM spark_writes WHERE id = :id

-- name: write_abandoned
-- Writes opened before :before and never ended: their driver died between
-- opening the write and its commit or abort.
SELECT id FROM spark_writes WHERE started_at < :before

-- name: stage_tables
-- Every staging table of a write, including those of failed or duplicate task
-- attempts, which the driver never hears about.
SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE :prefix || '%'

-- name: stage_create
CREATE TABLE IF NOT EXISTS {stage} (
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
)

-- name: stage_insert
INSERT INTO {stage} (queue, task, args, kwargs, priority, run_at, max_attempts, key,
                     group_key, batch)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: stage_drop
DROP TABLE IF EXISTS {stage}

-- name: stage_count
-- Staging tables are only appended to, so rowids run 1..n without gaps.
SELECT coalesce(max(rowid), 0) FROM {stage}

-- name: job_take_ids
UPDATE counters SET value = value + :count WHERE name = 'jobs' RETURNING value

-- name: stage_move
-- Ids :first .. :first + n - 1 were reserved under this same write lock, in
-- staging order, so jobs keep the DataFrame's order within a partition. A row
-- whose key a live job holds is skipped by OR IGNORE on jobs_live_key (the
-- first row of a key in the write wins); with unique = 'forever' any job that
-- ever held the key skips it. A skipped row leaves its id unused.
INSERT OR IGNORE INTO jobs (id, queue, task, args, kwargs, priority, run_at, max_attempts,
                            key, group_key, batch, created_at)
SELECT :first + s.rowid - 1, s.queue, s.task, s.args, s.kwargs, s.priority,
       coalesce(s.run_at, :now), s.max_attempts, s.key, s.group_key, s.batch, :now
FROM {stage} AS s
WHERE s.key IS NULL
   OR :unique = 'live'
   OR NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.queue = s.queue AND j.key = s.key)
ORDER BY s.rowid

-- name: event_insert_enqueued
INSERT INTO events (job_id, queue, task, kind, attempt, at)
SELECT id, queue, task, 'enqueued', 0, created_at FROM jobs WHERE id BETWEEN :first AND :last

-- name: id_bounds
SELECT min({id}), max({id}) FROM {table}

-- name: stream_latest
SELECT coalesce(max(seq), 0) FROM events

-- name: stream_latest_limited
-- The seq that ends a micro-batch of at most :limit events after :after.
SELECT max(seq) FROM (SELECT seq FROM events WHERE seq > :after ORDER BY seq LIMIT :limit)

-- name: read_range
SELECT {columns} FROM {table} WHERE {where} ORDER BY {id}

-- name: stream_read
-- SQLite has one writer, so seqs commit in order: every event up to a seq
-- that was read once is final.
SELECT {columns} FROM events WHERE seq > :after AND seq <= :until ORDER BY seq
