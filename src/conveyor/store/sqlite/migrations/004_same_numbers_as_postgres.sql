-- Nothing changes here: PostgreSQL's migration 004 indexes its events by
-- (xid, seq), which SQLite's events have no need of. The number is taken so
-- that a schema version means the same step on both databases.
--
-- In earlier versions this migration also made a table of the Spark layer,
-- which now makes its own tables with migrations of its own
-- (conveyor/spark/storage/migrations/): a database made before keeps the table
-- and its rows, and the Spark layer adopts it.
SELECT 1;
