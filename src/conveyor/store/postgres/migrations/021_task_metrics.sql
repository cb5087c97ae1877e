-- Per-task metrics, folded from the events (see conveyor/store/metrics_protocol.py):
-- counts per event kind and histograms of run time and queue wait, per queue,
-- task and minute (span 60), hour (span 3600) and since this migration (span 0,
-- start 0: the counters of /metrics). A fold adds the events after the offset in
-- task_metrics_folded; no job's enqueue, claim or finish writes here.
CREATE TABLE task_metrics (
    span    integer          NOT NULL,
    start   bigint           NOT NULL,  -- epoch seconds, a multiple of span
    queue   text             NOT NULL,
    task    text             NOT NULL,
    series  text             NOT NULL,  -- an event kind, or 'run' / 'wait'
    bucket  integer          NOT NULL,  -- of task_metric_bounds ('run', 'wait'), else 0
    jobs    bigint           NOT NULL,
    seconds double precision NOT NULL,  -- the samples' sum ('run', 'wait'), else 0
    -- In this order a chart's rows (one queue and task, or the rows of every
    -- task) are one range of it, and a table sums rows in the order it reads them.
    PRIMARY KEY (span, queue, task, series, bucket, start)
);

-- The prune's way to the old rows of a span (a fold writes it too; no job does).
CREATE INDEX task_metrics_start ON task_metrics (span, start);

-- One row: the offset (xid, seq) of the newest event folded, as in
-- finished_counts_folded (migration 011). A fold locks it and skips when another
-- fold holds it. Events before this migration are not folded.
CREATE TABLE task_metrics_folded (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid xid8   NOT NULL,
    seq bigint NOT NULL
);
INSERT INTO task_metrics_folded (xid, seq)
SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1)::text::xid8,
       9223372036854775807;

-- The histograms' upper bounds in seconds (metrics_protocol.BOUNDS): a sample's
-- bucket is the number of bounds below it, so one above them all is bucket 49.
CREATE TABLE task_metric_bounds (
    bucket integer          PRIMARY KEY,
    le     double precision NOT NULL
);
INSERT INTO task_metric_bounds (bucket, le) VALUES
    (0, 0.001),
    (1, 0.001414214),
    (2, 0.002),
    (3, 0.002828427),
    (4, 0.004),
    (5, 0.005656854),
    (6, 0.008),
    (7, 0.011313708),
    (8, 0.016),
    (9, 0.022627417),
    (10, 0.032),
    (11, 0.045254834),
    (12, 0.064),
    (13, 0.090509668),
    (14, 0.128),
    (15, 0.181019336),
    (16, 0.256),
    (17, 0.362038672),
    (18, 0.512),
    (19, 0.724077344),
    (20, 1.024),
    (21, 1.448154688),
    (22, 2.048),
    (23, 2.896309376),
    (24, 4.096),
    (25, 5.792618751),
    (26, 8.192),
    (27, 11.585237503),
    (28, 16.384),
    (29, 23.170475006),
    (30, 32.768),
    (31, 46.340950012),
    (32, 65.536),
    (33, 92.681900024),
    (34, 131.072),
    (35, 185.363800047),
    (36, 262.144),
    (37, 370.727600095),
    (38, 524.288),
    (39, 741.455200189),
    (40, 1048.576),
    (41, 1482.910400379),
    (42, 2097.152),
    (43, 2965.820800758),
    (44, 4194.304),
    (45, 5931.641601516),
    (46, 8388.608),
    (47, 11863.283203031),
    (48, 16777.216);
