-- What an operator sees of Spark's writes (`conveyor spark writes`): the options
-- a write was made with (a rerun under the same writeId must have the same), the
-- caller's id of a write still open, and an index for purging old results.
ALTER TABLE spark_write_results ADD COLUMN IF NOT EXISTS options text;
ALTER TABLE spark_writes ADD COLUMN IF NOT EXISTS result_id text;
CREATE INDEX IF NOT EXISTS spark_write_results_committed_at
    ON spark_write_results (committed_at);
