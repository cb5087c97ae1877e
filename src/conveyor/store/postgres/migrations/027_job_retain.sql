-- A job's own retention (retain=): how long it is kept once finished, by final
-- state, as JSON ({"succeeded": 3600.0, ...}); NULL for the jobs that follow
-- their queue's policy. The partial index holds the finished jobs that have a
-- rule, by when they finished, for the retention round (job_purge_retained),
-- and is empty while no job uses it. Adding a nullable column rewrites nothing.
ALTER TABLE jobs ADD COLUMN retain jsonb;
CREATE INDEX jobs_retaining ON jobs (finished_at)
WHERE retain IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled');
