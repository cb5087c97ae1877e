-- Nothing changes here; the number is taken so that a schema version means the
-- same step on every database.
--
-- In earlier versions this migration made two tables of the Spark layer, which
-- now makes its own tables with migrations of its own
-- (conveyor/spark/storage/migrations/): a database made before keeps the
-- tables and their rows, and the Spark layer adopts them.
SELECT 1;
