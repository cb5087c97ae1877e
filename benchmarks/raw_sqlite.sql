-- The raw SQL loop the SQLite store is measured against: the least a queue can
-- do with a job row that carries what a job needs (task, payload, attempts,
-- times, result), one partial index on queued jobs, and nothing else: no
-- events, no leases, no keys or groups.

-- name: create
CREATE TABLE IF NOT EXISTS raw_jobs (
    id          INTEGER PRIMARY KEY,
    queue       TEXT    NOT NULL,
    task        TEXT    NOT NULL,
    args        TEXT    NOT NULL,
    kwargs      TEXT    NOT NULL,
    state       TEXT    NOT NULL DEFAULT 'queued',
    priority    INTEGER NOT NULL DEFAULT 0,
    run_at      REAL    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    result      TEXT,
    created_at  REAL    NOT NULL,
    started_at  REAL,
    finished_at REAL
)

-- name: index
CREATE INDEX IF NOT EXISTS raw_jobs_queued ON raw_jobs (queue, priority DESC, id)
    WHERE state = 'queued'

-- name: insert
INSERT INTO raw_jobs (queue, task, args, kwargs, run_at, created_at) VALUES (?, ?, ?, ?, ?, ?)

-- name: claim
UPDATE raw_jobs SET state = 'running', attempts = attempts + 1, started_at = ?
WHERE id IN (SELECT id FROM raw_jobs
             WHERE state = 'queued' AND queue = ? AND run_at <= ?
             ORDER BY priority DESC, id LIMIT ?)
RETURNING id, task, args, kwargs, attempts

-- name: complete
UPDATE raw_jobs SET state = 'succeeded', finished_at = ?
WHERE id IN (SELECT value FROM json_each(?))
