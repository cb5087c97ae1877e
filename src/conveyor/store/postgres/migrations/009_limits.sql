-- Flow control: rate and concurrency limits per queue and per limit key, kept in
-- the database so that every worker of every process obeys them, and changed at
-- run time (conveyor limit, app.limit). The claim reads and writes them in its
-- own statement.

-- The key a per-key limit counts a job under (enqueue option limit_key). Added
-- last, so rows read by position keep their first columns; no default, so the
-- table is not rewritten.
ALTER TABLE jobs ADD COLUMN limit_key text;

-- Running and queued jobs of one key, queued ones oldest first: the per-key
-- concurrency count, and the rule that only a key's oldest ready jobs (as many
-- as it has room for) are claimable. Partial: jobs without a limit key cost
-- nothing more.
CREATE INDEX jobs_limit_key ON jobs (queue, limit_key, state, id) WHERE limit_key IS NOT NULL;

-- One row per queue that has a limit or a throttle. rate/per: at most rate jobs
-- started in any per seconds; concurrency: at most that many running. The key_
-- columns are the same per value of limit_key. version is bumped by every claim
-- that starts jobs of the queue: a claim locks this row and compares the version
-- it locked with the one its snapshot saw, to know its counts are current (see
-- job_claim).
CREATE TABLE limits (
    queue            text PRIMARY KEY,
    rate             integer          CHECK (rate > 0),
    per              double precision CHECK (per > 0),
    concurrency      integer          CHECK (concurrency > 0),
    key_rate         integer          CHECK (key_rate > 0),
    key_per          double precision CHECK (key_per > 0),
    key_concurrency  integer          CHECK (key_concurrency > 0),
    throttled_until  timestamptz,
    version          bigint      NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL
);

-- The recent starts of rate-limited queues: a sliding log, so that no window
-- of per seconds ever holds more than rate starts. One row per claim and limit
-- key, with the number of jobs that claim started (the jobs of one claim start
-- at one moment), written by the claim, kept for a window (plus slack) and then
-- pruned: at most a window's worth of rows per limit, however many jobs the
-- queue has done, and a claim counts rows of claims, not of jobs.
CREATE TABLE limit_starts (
    queue     text        NOT NULL,
    limit_key text,
    at        timestamptz NOT NULL,
    jobs      integer     NOT NULL DEFAULT 1
);
CREATE INDEX limit_starts_queue ON limit_starts (queue, at);
CREATE INDEX limit_starts_key ON limit_starts (queue, limit_key, at) WHERE limit_key IS NOT NULL;

-- Keys held back by a handler's ctx.throttle (a partner said "too many requests").
CREATE TABLE limit_throttles (
    queue     text        NOT NULL,
    limit_key text        NOT NULL,
    until     timestamptz NOT NULL,
    PRIMARY KEY (queue, limit_key)
);
