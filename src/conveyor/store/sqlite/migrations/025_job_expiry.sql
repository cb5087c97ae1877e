-- A job's deadline to start by (expires=), NULL for the jobs without one: see
-- PostgreSQL's migration 025. The partial index serves the maintenance sweep
-- (job_expire) and stays empty while no job uses expiry.
ALTER TABLE jobs ADD COLUMN expires_at REAL;
CREATE INDEX jobs_expiring ON jobs (expires_at) WHERE state = 'queued' AND expires_at IS NOT NULL;
-- The jobs that expired, by queue, for their counts (job_expired_counts): only
-- cancelled jobs that had a deadline are in it.
CREATE INDEX jobs_expired ON jobs (queue) WHERE state = 'cancelled' AND expires_at IS NOT NULL;
