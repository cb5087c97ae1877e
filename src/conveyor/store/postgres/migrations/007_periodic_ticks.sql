-- The last tick of each periodic task that was enqueued, written in the
-- transaction that enqueues it. Jobs are purged by retention and workers
-- restart, so neither can say whether a tick already ran; this row can.

CREATE TABLE periodic_ticks (
    name       text PRIMARY KEY,
    last_tick  timestamptz NOT NULL,
    job_id     bigint,
    updated_at timestamptz NOT NULL
);
