-- The decisions of parallel commits (conveyor.spark.storage.pieces): a write
-- whose pieces were prepared is committed when its row here is, and its pieces
-- are then committed, by its committer or by the next settle if it died. The
-- row goes once every piece is committed and the staging dropped.
CREATE TABLE IF NOT EXISTS spark_commits (
    token      text PRIMARY KEY,
    decided_at timestamptz NOT NULL
);
