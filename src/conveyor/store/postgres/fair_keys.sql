-- Each job's own fair key (fair_key=, conveyor.store.fair): written with the jobs
-- that have one, and read back.

-- name: job_set_fair_key
-- Run in the insert's own transaction, only for jobs enqueued with a fair key that
-- is not their limit_key: the enqueue's statement itself stays the one every job
-- pays for.
UPDATE jobs SET fair_key = d.fair_key
FROM unnest(%(ids)s::bigint[], %(keys)s::text[]) AS d(id, fair_key)
WHERE jobs.id = d.id

-- name: job_fair_keys
SELECT id, fair_key FROM jobs WHERE id = ANY(%(ids)s::bigint[]) AND fair_key IS NOT NULL
