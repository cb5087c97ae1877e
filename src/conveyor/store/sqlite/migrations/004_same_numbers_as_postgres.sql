-- Spark writes in progress. A write's tasks stage rows in tables of their own
-- (spark_stage_<write>_...) and the driver moves them into jobs in one
-- transaction. The row exists while the write is open: committing or aborting
-- deletes it, and a task checks for it in every transaction it writes in, so a
-- task Spark cancelled cannot stage rows after the write ended.
CREATE TABLE spark_writes (
    id         TEXT PRIMARY KEY,
    started_at REAL NOT NULL
);
