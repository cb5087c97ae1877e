-- Per-task metrics (migration 021, conveyor/store/metrics_protocol.py).

-- name: task_metrics_plan_for_values
-- As plan_for_values (queries.sql): the sessions plan generically, which suits the
-- claim; these reads are planned for their span and start (a generic plan of
-- a span's rows may read the whole table).
SET LOCAL plan_cache_mode = force_custom_plan

-- name: task_metrics_lock_fold
-- A fold's lock on the offset; no row when another fold holds it: then this one
-- is skipped (the other folds the same events).
SELECT xid::text, seq FROM task_metrics_folded FOR UPDATE SKIP LOCKED

-- name: task_metrics_fold
-- Add up to %(limit)s events after the offset to task_metrics, and move the
-- offset past them. As finished_counts_fold, only events of transactions below
-- the oldest one still running, in (xid, seq) order, so that each is folded once.
-- Samples: each counted kind (an enqueued event counts its jobs, migration 023); run time (start to end) of attempts that ended
-- succeeded, failed or retried; wait (due to start) of the attempt that is the
-- job's newest and started after its job's run_at, read from the job now (an
-- attempt whose job has moved on, or is gone, gives none). A sample's bucket is
-- the number of bounds below it. Samples are counted per minute first, then each
-- minute's counts go to the row of each span holding it and to the total row,
-- each for its task, for every task of its queue (task '') and for everything
-- (queue ''); rows are changed in key order, as every fold does.
WITH counted AS MATERIALIZED (
    SELECT job_id, queue, task, kind, attempt, at, started_at, jobs, xid, seq FROM events
    WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
      AND (xid, seq) > (%(xid)s::text::xid8, %(seq)s::bigint)
    ORDER BY xid, seq
    LIMIT %(limit)s
), samples AS (
    SELECT queue, task, kind AS series, 0.0::float8 AS seconds, at, coalesce(jobs, 1) AS n
    FROM counted
    WHERE kind IN ('enqueued', 'succeeded', 'failed', 'cancelled', 'retried', 'rescued',
                   'manual_retry')
    UNION ALL
    SELECT queue, task, 'run', extract(epoch FROM at - started_at)::float8, at, 1 FROM counted
    WHERE kind IN ('succeeded', 'failed', 'retried') AND started_at <= at
    UNION ALL
    SELECT c.queue, c.task, 'wait', extract(epoch FROM c.started_at - j.run_at)::float8, c.at, 1
    FROM counted AS c JOIN jobs AS j ON j.id = c.job_id
    WHERE c.kind IN ('succeeded', 'failed', 'cancelled', 'retried')
      AND j.attempts = c.attempt AND j.run_at <= c.started_at
), bucketed AS (
    SELECT s.queue, s.task, s.series, s.seconds, s.n, floor(extract(epoch FROM s.at))::bigint AS t,
           CASE WHEN s.series IN ('run', 'wait')
                THEN (SELECT count(*) FROM task_metric_bounds AS b WHERE b.le < s.seconds)
                ELSE 0 END AS bucket
    FROM samples AS s
), minutes AS (
    SELECT queue, task, series, bucket, t - t %% 60 AS t, sum(n) AS n, sum(seconds) AS seconds
    FROM bucketed
    GROUP BY 1, 2, 3, 4, 5
), added AS (
    INSERT INTO task_metrics AS m (span, start, queue, task, series, bucket, jobs, seconds)
    SELECT p.span, CASE WHEN p.span = 0 THEN 0 ELSE b.t - b.t %% p.span END AS start,
           CASE WHEN l.level = 2 THEN '' ELSE b.queue END,
           CASE WHEN l.level >= 1 THEN '' ELSE b.task END,
           b.series, b.bucket, sum(b.n), sum(b.seconds)
    FROM minutes AS b
    CROSS JOIN (VALUES (60), (600), (3600), (21600), (86400), (0)) AS p (span)
    CROSS JOIN (VALUES (0), (1), (2)) AS l (level)
    GROUP BY 1, 2, 3, 4, 5, 6
    ORDER BY 1, 3, 4, 5, 6, 2
    ON CONFLICT (span, queue, task, series, bucket, start)
    DO UPDATE SET jobs = m.jobs + excluded.jobs, seconds = m.seconds + excluded.seconds
), newest AS (
    SELECT xid, seq FROM counted ORDER BY xid DESC, seq DESC LIMIT 1
), moved AS (
    UPDATE task_metrics_folded SET xid = newest.xid, seq = newest.seq FROM newest
    RETURNING 1
)
SELECT count(*) FROM counted

-- name: task_metrics_per_task
-- The rows of a span from %(since)s on, summed over time per task (the rows of
-- every task, task '', left out), of one queue and one task when given.
SELECT queue, task, series, bucket, sum(jobs)::bigint, sum(seconds)::float8 FROM task_metrics
WHERE span = %(span)s AND start >= %(since)s AND task <> ''
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text) AND (%(task)s::text IS NULL OR task = %(task)s::text)
GROUP BY queue, task, series, bucket

-- name: task_metrics_per_time
-- The rows of one queue and task from %(since)s on, per start: one range of the
-- primary key. Task '' is every task of the queue; queue '' and task '' everything.
SELECT start, series, bucket, sum(jobs)::bigint, sum(seconds)::float8 FROM task_metrics
WHERE span = %(span)s AND queue = %(queue)s AND task = %(task)s AND start >= %(since)s
GROUP BY start, series, bucket

-- name: task_metrics_per_time_of_task
-- The rows of one task from %(since)s on, per start, summed over its queues.
SELECT start, series, bucket, sum(jobs)::bigint, sum(seconds)::float8 FROM task_metrics
WHERE span = %(span)s AND task = %(task)s AND start >= %(since)s
GROUP BY start, series, bucket

-- name: task_metrics_prune
-- Rows older than each span keeps them (metrics_protocol.KEPT); the totals stay.
DELETE FROM task_metrics
WHERE (span = 60 AND start < %(before_60)s) OR (span = 600 AND start < %(before_600)s)
   OR (span = 3600 AND start < %(before_3600)s)
   OR (span = 21600 AND start < %(before_21600)s)
   OR (span = 86400 AND start < %(before_86400)s)
