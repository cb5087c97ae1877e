-- A job's own retention (retain=): see PostgreSQL's migration 027. JSON text,
-- NULL for the jobs that follow their queue's policy; the partial index serves
-- the retention round (job_purge_retained) and stays empty while no job uses it.
ALTER TABLE jobs ADD COLUMN retain TEXT;
CREATE INDEX jobs_retaining ON jobs (finished_at)
WHERE retain IS NOT NULL AND state IN ('succeeded', 'failed', 'cancelled');
