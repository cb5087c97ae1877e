-- A job's deadline to start by (expires=), NULL for the jobs without one. A
-- claim reads it only for the rows it is about to take (the cheap predicate in
-- claimable); the partial index holds the queued jobs that have one, in
-- deadline order, for the maintenance sweep (job_expire), and is empty while no
-- job uses expiry. Adding a nullable column rewrites nothing.
ALTER TABLE jobs ADD COLUMN expires_at timestamptz;
CREATE INDEX jobs_expiring ON jobs (expires_at) WHERE state = 'queued' AND expires_at IS NOT NULL;
-- The jobs that expired, by queue, for their counts (job_expired_counts): only
-- cancelled jobs that had a deadline are in it.
CREATE INDEX jobs_expired ON jobs (queue) WHERE state = 'cancelled' AND expires_at IS NOT NULL;
