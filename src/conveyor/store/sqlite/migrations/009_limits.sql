-- Flow control: rate and concurrency limits per queue and per limit key, kept in
-- the database so that every worker of every process obeys them, and changed at
-- run time (conveyor limit, app.limit). The claim reads and writes them in its
-- own transaction.

-- The key a per-key limit counts a job under (enqueue option limit_key). Added
-- last, so rows read by position keep their first columns.
ALTER TABLE jobs ADD COLUMN limit_key TEXT;

-- Running and queued jobs of one key, queued ones oldest first: the per-key
-- concurrency count, and the rule that only a key's oldest ready jobs (as many
-- as it has room for) are claimable. Partial: jobs without a limit key cost
-- nothing more.
CREATE INDEX jobs_limit_key ON jobs (queue, limit_key, state, id) WHERE limit_key IS NOT NULL;

-- One row per queue that has a limit or a throttle. rate/per: at most rate jobs
-- started in any per seconds; concurrency: at most that many running. The key_
-- columns are the same per value of limit_key. version is bumped by every claim
-- that starts jobs of the queue (PostgreSQL reads it to tell a stale snapshot;
-- SQLite's single writer needs no such check and leaves it alone).
CREATE TABLE limits (
    queue            TEXT PRIMARY KEY,
    rate             INTEGER CHECK (rate > 0),
    per              REAL    CHECK (per > 0),
    concurrency      INTEGER CHECK (concurrency > 0),
    key_rate         INTEGER CHECK (key_rate > 0),
    key_per          REAL    CHECK (key_per > 0),
    key_concurrency  INTEGER CHECK (key_concurrency > 0),
    throttled_until  REAL,
    version          INTEGER NOT NULL DEFAULT 0,
    updated_at       REAL    NOT NULL
);

-- The recent starts of rate-limited queues: a sliding log, so that no window
-- of per seconds ever holds more than rate starts. One row per claim and limit
-- key, with the number of jobs that claim started (the jobs of one claim start
-- at one moment), written by the claim, kept for a window (plus slack) and then
-- pruned: at most a window's worth of rows per limit, however many jobs the
-- queue has done, and a claim counts rows of claims, not of jobs.
CREATE TABLE limit_starts (
    queue     TEXT    NOT NULL,
    limit_key TEXT,
    at        REAL    NOT NULL,
    jobs      INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX limit_starts_queue ON limit_starts (queue, at);
CREATE INDEX limit_starts_key ON limit_starts (queue, limit_key, at) WHERE limit_key IS NOT NULL;

-- Keys held back by a handler's ctx.throttle (a partner said "too many requests").
CREATE TABLE limit_throttles (
    queue     TEXT NOT NULL,
    limit_key TEXT NOT NULL,
    until     REAL NOT NULL,
    PRIMARY KEY (queue, limit_key)
);
