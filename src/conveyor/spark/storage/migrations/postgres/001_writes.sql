-- Spark's tables, made by the first Spark write to the database (or the first
-- read of a write's result). IF NOT EXISTS: before the Spark layer had its own
-- migrations, the store's migrations 004 and 008 made these three tables with
-- these same definitions, so a database that has them keeps them, rows and all,
-- and this migration adopts them.

-- Spark writes in progress. A write's tasks stage rows in tables of their own
-- (spark_stage_<write>_...) and the driver moves them into jobs in one
-- transaction. The row exists while the write is open: committing or aborting
-- deletes it, and a task locks it (FOR SHARE) in every transaction it writes
-- in, so a task Spark cancelled cannot stage rows after the write ended.
CREATE TABLE IF NOT EXISTS spark_writes (
    id         text PRIMARY KEY,
    started_at timestamptz NOT NULL
);

-- What each Spark write did, kept after it ends: the caller reads its counts,
-- a rerun with the same write id is recognised and enqueues nothing, and a
-- streaming sink's micro-batch replayed after a restart is not enqueued twice
-- (a stream's row is 'stream:' and its query's id, with the last batch it
-- committed). One small row per write, or per streaming query.
CREATE TABLE IF NOT EXISTS spark_write_results (
    id           text        PRIMARY KEY,
    batch        bigint,
    committed_at timestamptz NOT NULL,
    row_count    bigint      NOT NULL,  -- rows the write was given
    enqueued     bigint      NOT NULL,  -- jobs it created
    skipped      bigint      NOT NULL   -- rows left out: a job of their queue held their key
);

-- How far each partition of a non-atomic write has got, written in the
-- transaction that enqueues each batch: a retried task skips the rows its
-- failed attempt enqueued (checked by their checksum, a sum of row hashes).
CREATE TABLE IF NOT EXISTS spark_write_progress (
    write_id  text    NOT NULL,
    part      integer NOT NULL,
    row_count bigint  NOT NULL,
    checksum  bigint  NOT NULL,
    enqueued  bigint  NOT NULL,
    skipped   bigint  NOT NULL,
    PRIMARY KEY (write_id, part)
);
