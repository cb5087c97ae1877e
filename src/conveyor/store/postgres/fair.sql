-- Fair turns (conveyor.store.fair): a fair queue's claim, and its settings.
-- A job takes turns by its fair key: its own (column fair_key, written only when
-- enqueued with a fair_key= that is not its limit_key; '' for the shared key),
-- else its limit_key; jobs without one share one key ('' in fair_turns). The
-- per-key limits count by limit_key whatever the fair key.

-- name: now
coalesce(%(now)s::timestamptz, now())

-- name: fair_any
-- Which of the asked queues are fair, and whether any has limits (the question
-- the plain claim asks as often: one statement answers both).
SELECT coalesce(array_agg(f.queue), '{}'::text[]),
       EXISTS (SELECT 1 FROM limits WHERE queue = ANY(%(queues)s::text[]))
FROM fair_queues AS f
WHERE f.queue = ANY(%(queues)s::text[])

-- name: aged
-- The priority job j claims with: its own, plus k.aging_step for every
-- k.aging_every seconds it has been due, up to k.aging_cap more (aging).
j.priority + CASE WHEN k.aging_every IS NULL THEN 0
                  ELSE least(k.aging_cap, k.aging_step * floor(
                           greatest(extract(epoch FROM {{now}} - j.run_at), 0) / k.aging_every))
             END::integer

-- name: job_room
-- The room the queue's per-key limits leave job j's limit_key (NULL: no limit).
(SELECT {{conveyor.store.postgres/queries.sql:key_room}} FROM allowed AS a)

-- name: fair_key_jobs
-- The claimable jobs of key k.fair_key of queue k.queue (NULL: the shared key)
-- whose limit key has room, with the priority they claim with (aged), their
-- limit_key and its room, unordered: the caller orders and limits. A key's jobs
-- are found by jobs_limit_queued (those that take turns by their limit_key) and
-- jobs_fair_queued (those with a fair key of their own); the shared key's among
-- the queue's first 200 ready jobs in claim order (no index holds them apart, and
-- one that would costs every job of every queue): further back, they come into
-- reach as the jobs ahead start.
SELECT s.* FROM (
    SELECT j.id, {{aged}} AS priority, j.limit_key, {{job_room}} AS room FROM jobs AS j
    WHERE k.fair_key IS NOT NULL
      AND j.queue = k.queue AND j.limit_key = k.fair_key AND j.limit_key IS NOT NULL
      AND j.fair_key IS NULL
      AND {{conveyor.store.postgres/queries.sql:claimable}}
    UNION ALL
    SELECT j.id, {{aged}} AS priority, j.limit_key, {{job_room}} AS room FROM jobs AS j
    WHERE k.fair_key IS NOT NULL
      AND j.queue = k.queue AND j.fair_key = k.fair_key AND j.state = 'queued'
      AND {{conveyor.store.postgres/queries.sql:claimable}}
    UNION ALL
    SELECT w.id, w.priority, w.limit_key, w.room FROM (
        SELECT j.id, {{aged}} AS priority, j.limit_key, j.fair_key, {{job_room}} AS room
        FROM jobs AS j
        WHERE k.fair_key IS NULL AND j.queue = k.queue
          AND {{conveyor.store.postgres/queries.sql:claimable}}
        ORDER BY j.priority DESC, j.id
        LIMIT 200
    ) AS w
    WHERE nullif(coalesce(w.fair_key, w.limit_key), '') IS NULL
) AS s
WHERE coalesce(s.room, 1) > 0

-- name: turn_weight
-- The weight of the key of fair_turns row EXCLUDED.
(SELECT coalesce((f.weights ->> EXCLUDED.fair_key)::float8, f.default_weight)
 FROM fair_queues AS f WHERE f.queue = EXCLUDED.queue)

-- name: fair_claim
-- A claim of fair queue %(queue)s (not paused; within its limits, read and kept
-- as job_claim_limited does: the queue's room caps the claim, each key's room
-- its jobs). Weighted fair queueing by start tags: key k's
-- turn stands at pass(k); its i-th ready job would start at pass(k) + i/weight(k);
-- the claim takes the jobs of the highest priority with the smallest tags, so
-- that keys alternate, a key of weight 3 three times as often as one of weight
-- 1. A key that comes (back) starts at the queue's clock, never behind it: the
-- turn the first job of the last claim started at (the least turn then waiting).
--
-- Each key's best ready job is read (one index probe a key), the keys ranked by
-- it, and only the first %(limit)s keys searched further: no other key could
-- have one of the %(limit)s smallest tags. Only the chosen jobs are locked (SKIP
-- LOCKED, in claim order, so a concurrent claimer takes the next ones). The turns
-- move on in the same statement: each key's pass by its starts/weight, from the
-- newest value (concurrent claims add up), and the queue's clock.
WITH RECURSIVE lim AS MATERIALIZED (
    -- The queue's limits, as job_claim_limited reads them: its row locked (one
    -- claim of the queue at a time), and current (the version this snapshot reads).
    SELECT l.* FROM limits AS l WHERE l.queue = %(queue)s FOR UPDATE SKIP LOCKED
), allowed AS MATERIALIZED (
    SELECT u.*, {{conveyor.store.postgres/queries.sql:queue_allow}} AS allow
    FROM (SELECT {{conveyor.store.postgres/queries.sql:limit_use}}
          FROM lim AS l
          JOIN limits AS seen ON seen.queue = l.queue AND seen.version = l.version) AS u
), fair AS MATERIALIZED (
    SELECT f.queue, f.weights, f.default_weight, f.clock, f.aging_every, f.aging_step, f.aging_cap
    FROM fair_queues AS f
    WHERE f.queue = %(queue)s
      AND NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.name = f.queue AND p.paused)
      -- A queue with limits only when its row was this claim's, and has room.
      AND (NOT EXISTS (SELECT 1 FROM limits AS l WHERE l.queue = f.queue)
           OR EXISTS (SELECT 1 FROM allowed AS a WHERE a.allow > 0))
), keyed (fair_key) AS (
    -- The keys with queued jobs, one index probe each (a loose scan of jobs_limit_queued).
    (SELECT j.limit_key FROM jobs AS j
     WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.limit_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM fair)
     ORDER BY j.limit_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.limit_key FROM jobs AS j
            WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.limit_key IS NOT NULL
              AND j.limit_key > k.fair_key
            ORDER BY j.limit_key LIMIT 1)
    FROM keyed AS k WHERE k.fair_key IS NOT NULL
), fair_keyed (fair_key) AS (
    -- The fair keys of the jobs that have one of their own (jobs_fair_queued).
    (SELECT j.fair_key FROM jobs AS j
     WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.fair_key IS NOT NULL
       AND EXISTS (SELECT 1 FROM fair)
     ORDER BY j.fair_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.fair_key FROM jobs AS j
            WHERE j.queue = %(queue)s AND j.state = 'queued' AND j.fair_key IS NOT NULL
              AND j.fair_key > k.fair_key
            ORDER BY j.fair_key LIMIT 1)
    FROM fair_keyed AS k WHERE k.fair_key IS NOT NULL
), keys AS MATERIALIZED (
    SELECT k.queue, k.fair_key, k.weight, greatest(coalesce(t.pass, k.clock), k.clock) AS pass,
           h.priority AS top, k.aging_every, k.aging_step, k.aging_cap
    FROM (SELECT fair.queue, named.fair_key, fair.clock,
                 fair.aging_every, fair.aging_step, fair.aging_cap,
                 coalesce((fair.weights ->> named.fair_key)::float8, fair.default_weight) AS weight
          FROM fair CROSS JOIN (SELECT fair_key FROM keyed WHERE fair_key IS NOT NULL
                                UNION
                                SELECT fair_key FROM fair_keyed WHERE fair_key <> ''
                                UNION ALL SELECT NULL) AS named) AS k
    LEFT JOIN fair_turns AS t ON t.queue = k.queue AND t.fair_key = coalesce(k.fair_key, '')
    CROSS JOIN LATERAL (
        SELECT s.priority FROM ({{fair_key_jobs}}) AS s ORDER BY s.priority DESC, s.id LIMIT 1
    ) AS h
), chosen AS MATERIALIZED (
    SELECT * FROM keys AS k
    ORDER BY k.top DESC, k.pass + 1 / k.weight, k.fair_key
    LIMIT %(limit)s
), ranked AS MATERIALIZED (
    SELECT x.id, x.priority, x.limit_key, x.room, k.weight,
           k.pass + row_number() OVER (PARTITION BY k.fair_key ORDER BY x.priority DESC, x.id)
                    / k.weight AS tag
    FROM chosen AS k
    CROSS JOIN LATERAL (
        SELECT s.id, s.priority, s.limit_key, s.room FROM ({{fair_key_jobs}}) AS s
        ORDER BY s.priority DESC, s.id LIMIT %(limit)s
    ) AS x
), roomed AS (
    -- Each job's place among the jobs of its limit_key in claim order: a limit key
    -- (which jobs of several fair keys may share) starts as many as it has room for.
    SELECT r.*, row_number() OVER (PARTITION BY r.limit_key
                                   ORDER BY r.priority DESC, r.tag, r.id) AS nth
    FROM ranked AS r
), candidates AS MATERIALIZED (
    SELECT j.id, r.tag, r.weight FROM roomed AS r
    JOIN jobs AS j ON j.id = r.id AND j.state = 'queued'
    WHERE r.room IS NULL OR r.nth <= r.room
    ORDER BY r.priority DESC, r.tag, r.id
    LIMIT least(%(limit)s, (SELECT a.allow FROM allowed AS a))
    FOR UPDATE OF j SKIP LOCKED
),
{{conveyor.store.postgres/queries.sql:claim_apply}},
clocked AS (
    -- First the queue's row, then the keys' rows in key order: concurrent claims
    -- of the queue lock in one order (they never deadlock).
    UPDATE fair_queues SET clock = greatest(fair_queues.clock,
                                            (SELECT min(c.tag - 1 / c.weight) FROM candidates AS c))
    WHERE fair_queues.queue = %(queue)s AND EXISTS (SELECT 1 FROM claimed)
    RETURNING 1
), turned AS (
    -- EXCLUDED.pass is clock + n/weight: the key's pass becomes
    -- greatest(its newest pass, clock) + n/weight.
    INSERT INTO fair_turns AS t (queue, fair_key, pass, starts, recent, recent_at)
    SELECT %(queue)s, coalesce(c.fair_key, c.limit_key, ''), fair.clock + count(*) / min(k.weight),
           count(*), count(*), {{now}}
    FROM claimed AS c
    CROSS JOIN fair
    JOIN chosen AS k ON k.fair_key IS NOT DISTINCT FROM nullif(coalesce(c.fair_key, c.limit_key), '')
    WHERE EXISTS (SELECT 1 FROM clocked)
    GROUP BY coalesce(c.fair_key, c.limit_key, ''), fair.clock
    ORDER BY coalesce(c.fair_key, c.limit_key, '')
    ON CONFLICT (queue, fair_key) DO UPDATE
    SET pass = greatest(t.pass, EXCLUDED.pass - EXCLUDED.starts / {{turn_weight}})
               + EXCLUDED.starts / {{turn_weight}},
        starts = t.starts + EXCLUDED.starts,
        recent = t.recent * exp(-greatest(extract(epoch FROM EXCLUDED.recent_at - t.recent_at), 0) / 60)
                 + EXCLUDED.starts,
        recent_at = greatest(t.recent_at, EXCLUDED.recent_at)
),
-- A queue with limits: its starts recorded for the rates, the starts that left
-- every window forgotten, its version bumped (as job_claim_limited).
{{conveyor.store.postgres/queries.sql:limited_claim_kept}}
SELECT claimed.* FROM claimed

-- name: fair_set
-- Make a queue fair, or change its weights or aging: the turns already taken stay.
INSERT INTO fair_queues (queue, weights, default_weight, aging_every, aging_step, aging_cap,
                         updated_at)
VALUES (%(queue)s, %(weights)s::jsonb, %(default_weight)s, %(aging_every)s, %(aging_step)s,
        %(aging_cap)s, {{now}})
ON CONFLICT (queue) DO UPDATE
SET weights = EXCLUDED.weights, default_weight = EXCLUDED.default_weight,
    aging_every = EXCLUDED.aging_every, aging_step = EXCLUDED.aging_step,
    aging_cap = EXCLUDED.aging_cap, updated_at = EXCLUDED.updated_at

-- name: fair_off
-- A queue no longer fair: its settings and turns forgotten.
WITH turns AS (DELETE FROM fair_turns WHERE queue = %(queue)s)
DELETE FROM fair_queues WHERE queue = %(queue)s

-- name: fair_queues
SELECT f.queue, f.weights::text, f.default_weight, f.aging_every, f.aging_step, f.aging_cap
FROM fair_queues AS f
WHERE %(queue)s::text IS NULL OR f.queue = %(queue)s
ORDER BY f.queue

-- name: fair_keys
-- The busiest keys of fair queue %(queue)s ('' for the jobs without a key): queued
-- jobs, recent starts as written and the seconds since, all starts.
SELECT coalesce(r.fair_key, t.fair_key), coalesce(r.queued, 0), coalesce(t.recent, 0),
       coalesce(extract(epoch FROM {{now}} - t.recent_at), 0)::float8, coalesce(t.starts, 0)
FROM (SELECT coalesce(j.fair_key, j.limit_key, '') AS fair_key, count(*) AS queued FROM jobs AS j
      WHERE j.queue = %(queue)s AND j.state = 'queued'
      GROUP BY 1) AS r
FULL JOIN (SELECT * FROM fair_turns WHERE queue = %(queue)s) AS t ON t.fair_key = r.fair_key
ORDER BY coalesce(t.recent, 0) * exp(-greatest(extract(epoch FROM {{now}} - t.recent_at), 0) / 60) DESC NULLS LAST,
         coalesce(r.queued, 0) DESC, 1
LIMIT %(top)s
