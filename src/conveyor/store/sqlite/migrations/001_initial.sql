-- Times are stored as REAL seconds since the Unix epoch (UTC): compact, indexable,
-- and compared with plain < and <=.

CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY,  -- handed out from counters: never reused
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    state            TEXT    NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    args             TEXT    NOT NULL DEFAULT '[]',
    kwargs           TEXT    NOT NULL DEFAULT '{}',
    priority         INTEGER NOT NULL DEFAULT 0,
    run_at           REAL    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    key              TEXT,
    group_key        TEXT,
    batch            TEXT,
    worker           TEXT,
    lease_token      TEXT,
    lease_expires_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    error            TEXT,
    progress         REAL,
    progress_message TEXT,
    created_at       REAL    NOT NULL,
    started_at       REAL,
    finished_at      REAL
);

-- The claim scans this: ready jobs of a queue, highest priority first, then oldest.
CREATE INDEX jobs_queued ON jobs (queue, priority DESC, id) WHERE state = 'queued';
-- At most one live job per (queue, key): the idempotency guarantee.
CREATE UNIQUE INDEX jobs_live_key ON jobs (queue, key)
    WHERE key IS NOT NULL AND state IN ('queued', 'running');
CREATE INDEX jobs_key ON jobs (queue, key, id) WHERE key IS NOT NULL;
-- At most one running job per group, enforced by the database itself.
CREATE UNIQUE INDEX jobs_group_running ON jobs (group_key)
    WHERE group_key IS NOT NULL AND state = 'running';
-- Finding the oldest queued job of a group.
CREATE INDEX jobs_group_queued ON jobs (group_key, id)
    WHERE group_key IS NOT NULL AND state = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_batch ON jobs (batch) WHERE batch IS NOT NULL;

CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id  INTEGER NOT NULL,  -- no foreign key: purge deletes a job's events with it
    queue   TEXT    NOT NULL,
    task    TEXT    NOT NULL,
    kind    TEXT    NOT NULL,
    attempt INTEGER NOT NULL,
    worker  TEXT,
    at      REAL    NOT NULL,
    error   TEXT
);
CREATE INDEX events_job ON events (job_id, seq);

-- Job ids are taken from here, a batch at a time, under the write lock: never
-- reused even when the newest jobs are purged (which plain rowids would do),
-- and one update per batch instead of AUTOINCREMENT's one per row.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('jobs', 0);

CREATE TABLE queues (
    name       TEXT PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
);
