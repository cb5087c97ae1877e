-- The claim statement of each store as it was before limits (migration 008), kept
-- verbatim for benchmarks/store.py --limits: the unlimited claim before and after
-- the change, measured in the same run. Not used by conveyor itself.

-- ============================== SQLite
-- name: sqlite_job_claim
-- Each queue is searched on its own (the correlated subquery walks the
-- jobs_queued index of one queue in claim order and stops at :limit); the best
-- of those candidates win. A single "queue IN (...) ORDER BY" would sort every
-- queued job on each claim.
--
-- A job in a group is claimable only when it is its group's oldest queued job
-- and no job of the group is running; the unique index jobs_group_running
-- backs this up inside the database.
UPDATE jobs
SET state = 'running',
    attempts = attempts + 1,
    worker = :worker,
    lease_token = :token,
    lease_expires_at = :lease_expires_at,
    started_at = :now,
    progress = NULL,
    progress_message = NULL
WHERE id IN (
    SELECT c.id
    FROM json_each(:queues) AS q
    JOIN jobs AS c ON c.id IN (
        SELECT j.id FROM jobs AS j
        WHERE j.state = 'queued'
          AND j.queue = q.value
          AND j.run_at <= :now
          AND (:group IS NULL OR j.group_key = :group)
          AND (j.group_key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM jobs AS r
                          WHERE r.group_key = j.group_key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs AS o
                              WHERE o.group_key = j.group_key AND o.state = 'queued'
                                AND o.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT :limit)
    WHERE q.value NOT IN (SELECT name FROM queues WHERE paused)
    ORDER BY c.priority DESC, c.id
    LIMIT :limit
)
RETURNING *

-- ============================== PostgreSQL
-- name: postgres_job_claim
-- Each queue is searched on its own (the LATERAL subquery walks one queue's
-- jobs_queued index in claim order and stops at the limit); the best of those
-- candidates win. SKIP LOCKED lets concurrent claimers pass each other.
--
-- A job in a group is claimable only when it is its group's oldest queued job
-- and no job of the group is running. Those checks read this statement's
-- snapshot: a claimer that started before another claimer's commit can still
-- see the group idle and pick its next job. The unique index
-- jobs_group_running turns that into a unique violation, and the store
-- retries the claim with a fresh snapshot.
--
-- %(now)s NULL means the server's clock (now()): leases are judged on one
-- clock, whatever the clocks of the worker machines say.
--
-- MATERIALIZED: the locking candidate search must run exactly once.
WITH candidates AS MATERIALIZED (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority FROM jobs AS j
        WHERE j.state = 'queued'
          AND j.queue = q.name
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND (%(group)s::text IS NULL OR j.group_key = %(group)s)
          AND (j.group_key IS NULL OR (
              NOT EXISTS (SELECT 1 FROM jobs AS r
                          WHERE r.group_key = j.group_key AND r.state = 'running')
              AND NOT EXISTS (SELECT 1 FROM jobs AS o
                              WHERE o.group_key = j.group_key AND o.state = 'queued'
                                AND o.id < j.id)))
        ORDER BY j.priority DESC, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = q.name AND p.paused)
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE jobs
    SET state = 'running',
        attempts = jobs.attempts + 1,
        worker = %(worker)s,
        lease_token = %(token)s,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease)s::interval,
        started_at = coalesce(%(now)s::timestamptz, now()),
        progress = NULL,
        progress_message = NULL
    FROM candidates
    WHERE jobs.id = candidates.id
    RETURNING jobs.*
), claimed_events AS (
    INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
    SELECT id, queue, task, 'claimed', attempts, worker, coalesce(%(now)s::timestamptz, now()) FROM claimed ORDER BY id
)
SELECT * FROM claimed
