-- Each job's own fair key (fair_key=, conveyor.store.fair): written with the jobs
-- that have one, and read back.

-- name: job_set_fair_key
-- Run in the insert's own transaction, only for jobs enqueued with a fair key that
-- is not their limit_key. :keys is a JSON list of [id, key] pairs.
UPDATE jobs SET fair_key = k.value ->> '$[1]'
FROM json_each(:keys) AS k
WHERE jobs.id = k.value ->> '$[0]'

-- name: job_fair_keys
SELECT id, fair_key FROM jobs
WHERE id IN (SELECT value FROM json_each(:ids)) AND fair_key IS NOT NULL
