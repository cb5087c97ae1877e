-- Events in (xid, seq) order: readers that follow the event log (the metrics'
-- counters, the dashboard's offsets) read up to the oldest transaction still
-- running, in that order, so that a late commit is never skipped.
--
-- In earlier versions this migration also made a table of the Spark layer,
-- which now makes its own tables with migrations of its own
-- (conveyor/spark/storage/migrations/): a database made before keeps the table
-- and its rows, and the Spark layer adopts it.
CREATE INDEX events_xid ON events (xid, seq);
