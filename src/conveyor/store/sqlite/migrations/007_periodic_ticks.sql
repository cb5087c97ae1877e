-- The last tick of each periodic task that was enqueued, written in the
-- transaction that enqueues it. Jobs are purged by retention and workers
-- restart, so neither can say whether a tick already ran; this row can.

CREATE TABLE periodic_ticks (
    name       TEXT PRIMARY KEY,
    last_tick  REAL NOT NULL,
    job_id     INTEGER,
    updated_at REAL NOT NULL
);
