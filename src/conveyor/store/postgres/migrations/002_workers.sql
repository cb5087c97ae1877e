-- Live workers, for stats and the dashboard; and leader leases, so that one
-- worker at a time runs maintenance (rescue, retention, periodic tasks).

CREATE TABLE workers (
    id           text PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       jsonb       NOT NULL,
    concurrency  integer     NOT NULL,
    jobs_in_hand integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL
);

-- A lease row rather than an advisory lock: a lock lives as long as its
-- connection, and a leader that freezes (SIGSTOP, a long pause) keeps its
-- connection open, which would stop rescues cluster-wide. A lease runs out.
CREATE TABLE leaders (
    name       text PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);
