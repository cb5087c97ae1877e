-- Per-task metrics (migration 021, conveyor/store/metrics_protocol.py).

-- name: task_metrics_chunk
-- The events a fold takes: up to :limit after the offset (their newest seq, and
-- how many). Read under the write lock: events commit in seq order.
SELECT max(seq), count(*) FROM (
    SELECT seq FROM events WHERE seq > (SELECT seq FROM task_metrics_folded)
    ORDER BY seq LIMIT :limit
)

-- name: task_metrics_fold
-- Add the events after the offset, up to :upto, to task_metrics (the caller moves
-- the offset there in the same transaction). Samples: each counted kind; run
-- time (start to end) of attempts that ended succeeded, failed or retried; wait
-- (due to start) of the attempt that is the job's newest and started after its
-- job's run_at, read from the job now (an attempt whose job has moved on, or is
-- gone, gives none). A sample's bucket is the number of bounds below it. Each
-- sample goes to its minute, its hour and the total row.
WITH counted AS (
    SELECT job_id, queue, task, kind, attempt, at, started_at FROM events
    WHERE seq > (SELECT seq FROM task_metrics_folded) AND seq <= :upto
), samples AS (
    SELECT queue, task, kind AS series, 0.0 AS seconds, at FROM counted
    WHERE kind IN ('enqueued', 'succeeded', 'failed', 'cancelled', 'retried', 'rescued',
                   'manual_retry')
    UNION ALL
    SELECT queue, task, 'run', at - started_at, at FROM counted
    WHERE kind IN ('succeeded', 'failed', 'retried') AND started_at <= at
    UNION ALL
    SELECT c.queue, c.task, 'wait', c.started_at - j.run_at, c.at
    FROM counted AS c JOIN jobs AS j ON j.id = c.job_id
    WHERE c.kind IN ('succeeded', 'failed', 'cancelled', 'retried')
      AND j.attempts = c.attempt AND j.run_at <= c.started_at
), bucketed AS (
    SELECT s.queue, s.task, s.series, s.seconds, CAST(s.at AS INTEGER) AS t,
           CASE WHEN s.series IN ('run', 'wait')
                THEN (SELECT count(*) FROM task_metric_bounds AS b WHERE b.le < s.seconds)
                ELSE 0 END AS bucket
    FROM samples AS s
), spans (span) AS (
    VALUES (60), (3600), (0)
)
INSERT INTO task_metrics (span, start, queue, task, series, bucket, jobs, seconds)
SELECT p.span, CASE WHEN p.span = 0 THEN 0 ELSE b.t - b.t % p.span END,
       b.queue, b.task, b.series, b.bucket, count(*), sum(b.seconds)
FROM bucketed AS b CROSS JOIN spans AS p
GROUP BY 1, 2, 3, 4, 5, 6
ON CONFLICT (span, start, queue, task, series, bucket)
DO UPDATE SET jobs = jobs + excluded.jobs, seconds = seconds + excluded.seconds

-- name: task_metrics_fold_offset
UPDATE task_metrics_folded SET seq = :upto WHERE seq < :upto

-- name: task_metrics_per_task
-- The rows of a span from :since on, summed over time per task.
SELECT queue, task, series, bucket, sum(jobs), sum(seconds) FROM task_metrics
WHERE span = :span AND start >= :since
  AND (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
GROUP BY queue, task, series, bucket

-- name: task_metrics_per_time
-- The rows of a span from :since on, summed over the tasks per start.
SELECT start, series, bucket, sum(jobs), sum(seconds) FROM task_metrics
WHERE span = :span AND start >= :since
  AND (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
GROUP BY start, series, bucket

-- name: task_metrics_prune
DELETE FROM task_metrics
WHERE (span = 60 AND start < :minutes) OR (span = 3600 AND start < :hours)
