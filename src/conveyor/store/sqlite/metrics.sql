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
-- gone, gives none). A sample's bucket is the number of bounds below it. Samples
-- are counted per minute first, then each minute's counts go to the row of each
-- span holding it and to the total row, each for its task, for every task of its
-- queue (task '') and for everything (queue '').
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
), minutes AS (
    SELECT queue, task, series, bucket, t - t % 60 AS t, count(*) AS n, sum(seconds) AS seconds
    FROM bucketed
    GROUP BY 1, 2, 3, 4, 5
), spans (span) AS (
    VALUES (60), (600), (3600), (21600), (86400), (0)
), levels (level) AS (
    VALUES (0), (1), (2)
)
INSERT INTO task_metrics (span, start, queue, task, series, bucket, jobs, seconds)
SELECT p.span, CASE WHEN p.span = 0 THEN 0 ELSE b.t - b.t % p.span END,
       CASE WHEN l.level = 2 THEN '' ELSE b.queue END,
       CASE WHEN l.level >= 1 THEN '' ELSE b.task END,
       b.series, b.bucket, sum(b.n), sum(b.seconds)
FROM minutes AS b CROSS JOIN spans AS p CROSS JOIN levels AS l
GROUP BY 1, 2, 3, 4, 5, 6
ON CONFLICT (span, queue, task, series, bucket, start)
DO UPDATE SET jobs = jobs + excluded.jobs, seconds = seconds + excluded.seconds

-- name: task_metrics_fold_offset
UPDATE task_metrics_folded SET seq = :upto WHERE seq < :upto

-- name: task_metrics_per_task
-- The rows of a span from :since on, summed over time per task (the rows of
-- every task, task '', left out), of one queue and one task when given.
SELECT queue, task, series, bucket, sum(jobs), sum(seconds) FROM task_metrics
WHERE span = :span AND start >= :since AND task <> ''
  AND (:queue IS NULL OR queue = :queue) AND (:task IS NULL OR task = :task)
GROUP BY queue, task, series, bucket

-- name: task_metrics_per_time
-- The rows of one queue and task from :since on, per start: one range of the
-- primary key. Task '' is every task of the queue; queue '' and task '' everything.
SELECT start, series, bucket, sum(jobs), sum(seconds) FROM task_metrics
WHERE span = :span AND queue = :queue AND task = :task AND start >= :since
GROUP BY start, series, bucket

-- name: task_metrics_per_time_of_task
-- The rows of one task from :since on, per start, summed over its queues.
SELECT start, series, bucket, sum(jobs), sum(seconds) FROM task_metrics
WHERE span = :span AND task = :task AND start >= :since
GROUP BY start, series, bucket

-- name: task_metrics_prune
-- Rows older than each span keeps them (metrics_protocol.KEPT); the totals stay.
DELETE FROM task_metrics
WHERE (span = 60 AND start < :before_60) OR (span = 600 AND start < :before_600)
   OR (span = 3600 AND start < :before_3600)
   OR (span = 21600 AND start < :before_21600)
   OR (span = 86400 AND start < :before_86400)
