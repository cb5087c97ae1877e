-- Spark writes in progress. A write's tasks stage rows in tables of their own
-- (spark_stage_<write>_...) and the driver moves them into jobs in one
-- transaction. The row exists while the write is open: committing or aborting
-- deletes it, and a task locks it (FOR SHARE) in every transaction it writes
-- in, so a task Spark cancelled cannot stage rows after the write ended.
CREATE TABLE spark_writes (
    id         text PRIMARY KEY,
    started_at timestamptz NOT NULL
);

-- The event stream reads events in (xid, seq) order: see the Spark source.
CREATE INDEX events_xid ON events (xid, seq);
