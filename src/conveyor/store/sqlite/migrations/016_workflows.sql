-- Workflows: jobs that wait for other jobs (enqueue option after=, declared
-- graphs). See docs/workflows.md.
--
-- A new state, waiting: enqueued after jobs that have not all succeeded yet.
-- SQLite cannot change a CHECK in place, so the table is rebuilt (as in
-- migration 005) and its indexes and trigger made again; ids, rows and events are
-- unchanged. A waiting job is in none of the claim's indexes (they hold
-- queued jobs only), so claims never read it. It holds its key like a queued
-- one: jobs_live_key counts it live.
CREATE TABLE jobs_rebuilt (
    id               INTEGER PRIMARY KEY,  -- handed out from counters: never reused
    queue            TEXT    NOT NULL,
    task             TEXT    NOT NULL,
    state            TEXT    NOT NULL DEFAULT 'queued'
                     CHECK (state = 'queued' OR state = 'running' OR state = 'succeeded'
                            OR state = 'failed' OR state = 'cancelled' OR state = 'waiting'),
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
    finished_at      REAL,
    limit_key        TEXT,
    headers          TEXT,
    processed_mark   REAL,
    held_run_at      REAL
);

INSERT INTO jobs_rebuilt SELECT * FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_rebuilt RENAME TO jobs;

CREATE INDEX jobs_queued ON jobs (queue, priority DESC, id, run_at) WHERE state = 'queued';
CREATE UNIQUE INDEX jobs_live_key ON jobs (queue, key)
    WHERE key IS NOT NULL AND (state = 'queued' OR state = 'running' OR state = 'waiting');
CREATE INDEX jobs_key ON jobs (queue, key, id) WHERE key IS NOT NULL;
CREATE UNIQUE INDEX jobs_group_running ON jobs (group_key)
    WHERE group_key IS NOT NULL AND state = 'running';
CREATE INDEX jobs_group_queued ON jobs (group_key, id)
    WHERE group_key IS NOT NULL AND state = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'running';
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_batch ON jobs (batch) WHERE batch IS NOT NULL;
CREATE INDEX jobs_queue_state ON jobs (queue, state, id);
CREATE INDEX jobs_group ON jobs (group_key, id) WHERE group_key IS NOT NULL;
CREATE INDEX jobs_limit_key ON jobs (queue, limit_key, state, id) WHERE limit_key IS NOT NULL;
CREATE INDEX jobs_limit_queued ON jobs (queue, limit_key, id)
    WHERE state = 'queued' AND limit_key IS NOT NULL;
-- Dropped with the old table: made again (migration 013).
CREATE TRIGGER job_steps_gone AFTER DELETE ON jobs
BEGIN
    DELETE FROM job_steps WHERE job_id = old.id;
END;

-- One row per edge: child waits for parent. resolved is NULL until the parent
-- ends, then the state it ended in; an edge is resolved once, whatever happens
-- to the parent later (a manual retry). Read both ways: a parent's children
-- when it ends, a child's parents for ctx.upstream and the job page.
CREATE TABLE job_edges (
    child    INTEGER NOT NULL,
    parent   INTEGER NOT NULL,
    resolved TEXT,
    PRIMARY KEY (child, parent)
) WITHOUT ROWID;
CREATE INDEX job_edges_parent ON job_edges (parent, child);

-- One row per job that waits for others or belongs to a declared workflow.
-- pending: its parents not yet ended, counted down by their finishes, so that
-- the last parent's finish knows at once (not by counting edges) that the
-- child may run. on_failure: what a parent's failure does to it ('cancel' or
-- 'run').
CREATE TABLE job_flows (
    job_id     INTEGER PRIMARY KEY,
    pending    INTEGER NOT NULL DEFAULT 0,
    on_failure TEXT    NOT NULL DEFAULT 'cancel',
    workflow   TEXT
);
CREATE INDEX job_flows_workflow ON job_flows (workflow, job_id) WHERE workflow IS NOT NULL;

-- Declared workflows: a graph enqueued at once under an id (a repeated enqueue
-- with the same id returns this one).
CREATE TABLE workflows (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    jobs       INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX workflows_created ON workflows (created_at);
