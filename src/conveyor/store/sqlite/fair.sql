-- Fair turns (conveyor.store.fair) on SQLite: the rules of the PostgreSQL
-- statements of the same names (store/postgres/fair.sql), in one claim
-- transaction under the write lock: the claim, then the queue's clock, then the
-- keys' turns. A job takes turns by its own fair key (column fair_key, '' for
-- the shared key), else its limit_key; jobs without one share one key ('' in
-- fair_turns). The per-key limits count by limit_key whatever the fair key.

-- name: now
:now

-- name: fair_any
SELECT queue FROM fair_queues WHERE queue IN (SELECT value FROM json_each(:queues))

-- name: aged
-- The priority job j claims with (see aged on PostgreSQL).
j.priority + CASE WHEN k.aging_every IS NULL THEN 0
                  ELSE min(k.aging_cap, k.aging_step * CAST(
                           max(:now - j.run_at, 0) / k.aging_every AS INTEGER))
             END

-- name: job_room
-- The room the queue's per-key limits leave job j's limit_key (NULL: no limit).
(SELECT {{conveyor.store.sqlite/queries.sql:key_room}} FROM allowed AS a)

-- name: fair_key_jobs
-- The claimable jobs of key k.fair_key of queue k.queue whose limit key has room
-- (see fair_key_jobs on PostgreSQL; NULL: the shared key, among the queue's first
-- 200 ready jobs in claim order), unordered.
SELECT s.id, s.priority FROM (
    SELECT j.id, {{aged}} AS priority, {{job_room}} AS room FROM jobs AS j
    WHERE k.fair_key IS NOT NULL
      AND j.queue = k.queue AND j.limit_key = k.fair_key AND j.limit_key IS NOT NULL
      AND j.fair_key IS NULL
      AND {{conveyor.store.sqlite/queries.sql:claimable}}
    UNION ALL
    SELECT j.id, {{aged}} AS priority, {{job_room}} AS room FROM jobs AS j
    WHERE k.fair_key IS NOT NULL
      AND j.queue = k.queue AND j.fair_key = k.fair_key AND j.state = 'queued'
      AND {{conveyor.store.sqlite/queries.sql:claimable}}
    UNION ALL
    SELECT w.id, w.priority, w.room FROM (
        SELECT j.id, {{aged}} AS priority, j.limit_key, j.fair_key, {{job_room}} AS room
        FROM jobs AS j
        WHERE k.fair_key IS NULL AND j.queue = k.queue
          AND {{conveyor.store.sqlite/queries.sql:claimable}}
        ORDER BY j.priority DESC, j.id
        LIMIT 200
    ) AS w
    WHERE nullif(coalesce(w.fair_key, w.limit_key), '') IS NULL
) AS s
WHERE coalesce(s.room, 1) > 0

-- name: fair_keys_ranked
-- Each key of fair queue :queue with a ready job: its weight, its pass (never
-- behind the queue's clock) and its best ready job's priority.
WITH RECURSIVE fair AS (
    SELECT f.queue, f.weights, f.default_weight, f.clock, f.aging_every, f.aging_step,
           f.aging_cap
    FROM fair_queues AS f
    WHERE f.queue = :queue AND f.queue NOT IN (SELECT name FROM queues WHERE paused)
), keyed (fair_key) AS (
    SELECT (SELECT j.limit_key FROM jobs AS j
            WHERE j.queue = :queue AND j.state = 'queued' AND j.limit_key IS NOT NULL
            ORDER BY j.limit_key LIMIT 1)
    WHERE EXISTS (SELECT 1 FROM fair)
    UNION ALL
    SELECT (SELECT j.limit_key FROM jobs AS j
            WHERE j.queue = :queue AND j.state = 'queued' AND j.limit_key IS NOT NULL
              AND j.limit_key > k.fair_key
            ORDER BY j.limit_key LIMIT 1)
    FROM keyed AS k WHERE k.fair_key IS NOT NULL
), fair_keyed (fair_key) AS (
    -- The fair keys of the jobs that have one of their own (jobs_fair_queued).
    SELECT (SELECT j.fair_key FROM jobs AS j
            WHERE j.queue = :queue AND j.state = 'queued' AND j.fair_key IS NOT NULL
            ORDER BY j.fair_key LIMIT 1)
    WHERE EXISTS (SELECT 1 FROM fair)
    UNION ALL
    SELECT (SELECT j.fair_key FROM jobs AS j
            WHERE j.queue = :queue AND j.state = 'queued' AND j.fair_key IS NOT NULL
              AND j.fair_key > k.fair_key
            ORDER BY j.fair_key LIMIT 1)
    FROM fair_keyed AS k WHERE k.fair_key IS NOT NULL
), named AS (
    SELECT fair.queue, n.fair_key, fair.clock, fair.aging_every, fair.aging_step, fair.aging_cap,
           coalesce((SELECT w.value FROM json_each(fair.weights) AS w WHERE w.key = n.fair_key),
                    fair.default_weight) AS weight
    FROM fair CROSS JOIN (SELECT fair_key FROM keyed WHERE fair_key IS NOT NULL
                          UNION
                          SELECT fair_key FROM fair_keyed WHERE fair_key <> ''
                          UNION ALL SELECT NULL) AS n
)
SELECT k.queue, k.fair_key, k.weight, max(coalesce(t.pass, k.clock), k.clock) AS pass,
       k.aging_every, k.aging_step, k.aging_cap,
       (SELECT s.priority FROM ({{fair_key_jobs}}) AS s
        ORDER BY s.priority DESC, s.id LIMIT 1) AS top
FROM named AS k
LEFT JOIN fair_turns AS t ON t.queue = k.queue AND t.fair_key = coalesce(k.fair_key, '')

-- name: fair_claim
-- The claim (see fair_claim on PostgreSQL): the first :limit keys by their best
-- job and next tag, searched further; their jobs ranked by start tag; within the
-- queue's limits (its room caps the claim, each key's room its jobs). Ends in the
-- claimed jobs; fair_clock and fair_turns then move the turns on (and the
-- caller records the starts of a limited queue, as for job_claim_limited).
WITH allowed AS MATERIALIZED (
    -- The queue's limits, as job_claim_limited reads them (none: no row).
    SELECT u.*, {{conveyor.store.sqlite/queries.sql:queue_allow}} AS allow
    FROM (SELECT {{conveyor.store.sqlite/queries.sql:limit_use}}
          FROM limits AS l WHERE l.queue = :queue) AS u
), keys AS MATERIALIZED (
    -- Each key with a ready job whose limit key has room.
    SELECT r.* FROM ({{fair_keys_ranked}}) AS r WHERE r.top IS NOT NULL
), chosen AS MATERIALIZED (
    SELECT * FROM keys AS k
    ORDER BY k.top DESC, k.pass + 1.0 / k.weight, k.fair_key
    LIMIT :limit
), ranked AS (
    SELECT j.id, {{aged}} AS priority, j.limit_key, {{job_room}} AS room,
           k.pass + row_number() OVER (PARTITION BY k.fair_key ORDER BY {{aged}} DESC, j.id)
                    * 1.0 / k.weight AS tag
    FROM chosen AS k
    JOIN jobs AS j ON j.id IN (
        SELECT s.id FROM ({{fair_key_jobs}}) AS s ORDER BY s.priority DESC, s.id LIMIT :limit)
)
UPDATE jobs SET {{conveyor.store.sqlite/queries.sql:claim_set}}
-- Each job's place among the jobs of its limit_key in claim order: a limit key
-- (which jobs of several fair keys may share) starts as many as it has room for.
WHERE id IN (SELECT r.id FROM (SELECT r.*, row_number() OVER (
                                   PARTITION BY r.limit_key ORDER BY r.priority DESC, r.tag, r.id
                               ) AS nth FROM ranked AS r) AS r
             WHERE r.room IS NULL OR r.nth <= r.room
             ORDER BY r.priority DESC, r.tag, r.id
             LIMIT coalesce((SELECT a.allow FROM allowed AS a), :limit))
RETURNING *

-- name: fair_clock
-- The queue's clock after claim :ids: the least turn the claim started from
-- (never back).
WITH fair AS (SELECT * FROM fair_queues WHERE queue = :queue)
UPDATE fair_queues SET clock = max(clock, coalesce((
    SELECT min(max(coalesce(t.pass, fair.clock), fair.clock))
    FROM (SELECT DISTINCT coalesce(j.fair_key, j.limit_key, '') AS fair_key FROM jobs AS j
          WHERE j.id IN (SELECT value FROM json_each(:ids))) AS c
    CROSS JOIN fair
    LEFT JOIN fair_turns AS t ON t.queue = fair.queue AND t.fair_key = c.fair_key), clock))
WHERE queue = :queue

-- name: fair_turns
-- Each key of claim :ids moves on by its starts / its weight, from where it stood,
-- never behind the clock (fair_clock, just run, moved it at most to the least
-- of those keys' turns); its starts are counted.
INSERT INTO fair_turns AS t (queue, fair_key, pass, starts, recent, recent_at)
SELECT :queue, c.fair_key,
       f.clock + c.n * 1.0 / coalesce((SELECT w.value FROM json_each(f.weights) AS w
                                       WHERE w.key = c.fair_key), f.default_weight),
       c.n, c.n, :now
FROM (SELECT coalesce(j.fair_key, j.limit_key, '') AS fair_key, count(*) AS n FROM jobs AS j
      WHERE j.id IN (SELECT value FROM json_each(:ids))
      GROUP BY 1) AS c
JOIN fair_queues AS f ON f.queue = :queue
WHERE true
ON CONFLICT (queue, fair_key) DO UPDATE
SET pass = max(t.pass, (SELECT clock FROM fair_queues WHERE queue = :queue))
           + excluded.pass - (SELECT clock FROM fair_queues WHERE queue = :queue),
    starts = t.starts + excluded.starts,
    recent = t.recent * exp(-max(excluded.recent_at - t.recent_at, 0) / 60.0) + excluded.starts,
    recent_at = max(t.recent_at, excluded.recent_at)

-- name: fair_set
INSERT INTO fair_queues (queue, weights, default_weight, aging_every, aging_step, aging_cap,
                         updated_at)
VALUES (:queue, :weights, :default_weight, :aging_every, :aging_step, :aging_cap, :now)
ON CONFLICT (queue) DO UPDATE
SET weights = excluded.weights, default_weight = excluded.default_weight,
    aging_every = excluded.aging_every, aging_step = excluded.aging_step,
    aging_cap = excluded.aging_cap, updated_at = excluded.updated_at

-- name: fair_off_turns
DELETE FROM fair_turns WHERE queue = :queue

-- name: fair_off
DELETE FROM fair_queues WHERE queue = :queue

-- name: fair_queues
SELECT f.queue, f.weights, f.default_weight, f.aging_every, f.aging_step, f.aging_cap
FROM fair_queues AS f
WHERE :queue IS NULL OR f.queue = :queue
ORDER BY f.queue

-- name: fair_keys
-- See fair_keys on PostgreSQL (SQLite has no FULL JOIN before 3.39: two halves).
WITH r AS (
    SELECT coalesce(j.fair_key, j.limit_key, '') AS fair_key, count(*) AS queued FROM jobs AS j
    WHERE j.queue = :queue AND j.state = 'queued'
    GROUP BY 1
), t AS (SELECT * FROM fair_turns WHERE queue = :queue), both_halves AS (
    SELECT r.fair_key, r.queued, coalesce(t.recent, 0) AS recent,
           coalesce(:now - t.recent_at, 0) AS since, coalesce(t.starts, 0) AS starts
    FROM r LEFT JOIN t ON t.fair_key = r.fair_key
    UNION ALL
    SELECT t.fair_key, 0, t.recent, :now - t.recent_at, t.starts
    FROM t WHERE t.fair_key NOT IN (SELECT fair_key FROM r)
)
SELECT * FROM both_halves
ORDER BY recent * exp(-max(since, 0) / 60.0) DESC, queued DESC, fair_key
LIMIT :top
