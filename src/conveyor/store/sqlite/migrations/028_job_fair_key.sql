-- A job's fair key (fair_key=): see PostgreSQL's migration 028. NULL for the jobs
-- that take turns by their limit_key; the partial index serves the fair claim and
-- stays empty while no job uses it.
ALTER TABLE jobs ADD COLUMN fair_key TEXT;
CREATE INDEX jobs_fair_queued ON jobs (queue, fair_key, id)
WHERE state = 'queued' AND fair_key IS NOT NULL;
