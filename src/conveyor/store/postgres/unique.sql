-- Keys whose finished jobs hold them (unique="forever", a Unique window): the
-- enqueue's key lookup and its insert are one decision, so a job of the key
-- that is inserted, claimed and finished by others in between must not go
-- unseen (the live-key index, jobs_live_key, no longer sees a finished job).

-- name: job_keys_lock
-- Takes a transaction-scoped advisory lock on each (queue, key) pair, in one
-- order (no two enqueues wait on each other), before the lookup: an enqueue of
-- the key in another transaction waits for this one to commit, and its own
-- lookup, a later statement with a later snapshot, sees what this one wrote.
-- The lock must come before the lookup's statement, not inside it: a statement
-- reads with the snapshot it started with, taken before any lock it waits for.
SELECT count(pg_advisory_xact_lock(h))
FROM (
    SELECT DISTINCT hashtextextended(q, hashtextextended(k, 0)) AS h
    FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS p(q, k)
    ORDER BY h
) AS pairs
