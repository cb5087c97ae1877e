-- A job's deadline to start by (expires=), NULL for the jobs without one: see
-- PostgreSQL's migration 025. The partial index serves the maintenance sweep
-- (job_expire) and stays empty while no job uses expiry.
ALTER TABLE jobs ADD COLUMN expires_at REAL;
CREATE INDEX jobs_expiring ON jobs (expires_at) WHERE state = 'queued' AND expires_at IS NOT NULL;
