-- The raw SQL loop the PostgreSQL store is measured against: the least a queue
-- can do with a job row that carries what a job needs (task, payload, attempts,
-- times, result), one partial index on queued jobs, SKIP LOCKED claims, and
-- nothing else: no events, no leases, no keys or groups.

-- name: create
CREATE TABLE IF NOT EXISTS raw_jobs (
    id          bigserial PRIMARY KEY,
    queue       text        NOT NULL,
    task        text        NOT NULL,
    args        jsonb       NOT NULL,
    kwargs      jsonb       NOT NULL,
    state       text        NOT NULL DEFAULT 'queued',
    priority    integer     NOT NULL DEFAULT 0,
    run_at      timestamptz NOT NULL,
    attempts    integer     NOT NULL DEFAULT 0,
    result      jsonb,
    created_at  timestamptz NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz
)

-- name: index
CREATE INDEX IF NOT EXISTS raw_jobs_queued ON raw_jobs (queue, priority DESC, id)
    WHERE state = 'queued'

-- name: insert
INSERT INTO raw_jobs (queue, task, args, kwargs, run_at, created_at)
VALUES (%s, %s, %s, %s, %s, %s)

-- name: claim
UPDATE raw_jobs SET state = 'running', attempts = attempts + 1, started_at = %s
WHERE id IN (SELECT id FROM raw_jobs
             WHERE state = 'queued' AND queue = %s AND run_at <= %s
             ORDER BY priority DESC, id LIMIT %s
             FOR UPDATE SKIP LOCKED)
RETURNING id, task, args, kwargs, attempts

-- name: complete
UPDATE raw_jobs SET state = 'succeeded', finished_at = %s WHERE id = ANY(%s)
