-- Live workers, for stats and the dashboard; and leader leases, so that one
-- worker at a time runs maintenance (rescue, retention, periodic tasks).

CREATE TABLE workers (
    id           TEXT PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT    NOT NULL,  -- JSON array
    concurrency  INTEGER NOT NULL,
    jobs_in_hand INTEGER NOT NULL DEFAULT 0,
    started_at   REAL    NOT NULL,
    last_seen_at REAL    NOT NULL
);

-- A lease row rather than a lock held by a connection: a leader that freezes
-- (SIGSTOP, a long GC pause) loses leadership when its lease runs out, so
-- rescues never stop cluster-wide.
CREATE TABLE leaders (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at REAL NOT NULL
);
