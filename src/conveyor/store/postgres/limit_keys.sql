-- Reads of single limit keys (conveyor/store/limit_keys.py): for operators, not
-- a path of the claim.

-- name: limit_key_usage
-- One key of a queue: its running jobs (jobs_limit_key), its starts in the key
-- rate's window (limit_starts_key; none counted when the key has no rate), and
-- its throttle while it lasts.
SELECT
    (SELECT count(*) FROM jobs
     WHERE queue = %(queue)s AND limit_key = %(key)s AND state = 'running'),
    (SELECT coalesce(sum(s.jobs), 0) FROM limit_starts AS s JOIN limits AS l ON l.queue = s.queue
     WHERE s.queue = %(queue)s AND s.limit_key = %(key)s AND l.key_rate IS NOT NULL
       AND s.at > %(now)s::timestamptz - make_interval(secs => l.key_per)),
    (SELECT until FROM limit_throttles
     WHERE queue = %(queue)s AND limit_key = %(key)s AND until > %(now)s)

-- name: limit_throttled_keys
-- Keys throttled now, of %(queue)s (every queue when NULL), the soonest to end first.
SELECT queue, limit_key, until FROM limit_throttles
WHERE until > %(now)s AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY until, queue, limit_key
LIMIT %(limit)s
