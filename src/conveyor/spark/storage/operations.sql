-- Named statements of what an operator does with Spark's writes: list them,
-- clear abandoned ones, purge old results, remember a write's options. Both
-- dialects read this file; PostgreSQL reads its :name placeholders as pyformat.

-- name: spark_write_list
-- Past writes (their recorded results) and writes still open, newest first.
-- An open write started before :abandoned_before is taken for abandoned.
SELECT id, state, at, row_count, enqueued, skipped FROM (
    SELECT id, 'committed' AS state, committed_at AS at, row_count, enqueued, skipped
    FROM spark_write_results
    UNION ALL
    SELECT coalesce(result_id, id),
           CASE WHEN started_at < :abandoned_before THEN 'abandoned' ELSE 'running' END,
           started_at, NULL, NULL, NULL
    FROM spark_writes
) AS w
ORDER BY at DESC, id
LIMIT :limit

-- name: spark_write_open_list
-- The open writes, each with the name it is shown by.
SELECT id, coalesce(result_id, id) FROM spark_writes

-- name: spark_write_results_purge
-- Results older than the retention: their writeId may then be written again.
DELETE FROM spark_write_results WHERE committed_at < :before

-- name: spark_write_describe
-- The options a write was made with, kept once (the first commit's).
UPDATE spark_write_results SET options = coalesce(options, :options) WHERE id = :id

-- name: spark_write_options
SELECT options FROM spark_write_results WHERE id = :id
