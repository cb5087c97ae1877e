-- A job's fair key (fair_key=): the key a fair queue's turns count it under when
-- that is not its limit_key; '' for the shared key of the jobs without one. NULL
-- for every job that takes turns by its limit_key, so they write nothing more.
-- The partial index finds a fair key's queued jobs for the fair claim, and is
-- empty while no job uses it. Adding a nullable column rewrites nothing.
ALTER TABLE jobs ADD COLUMN fair_key text;
CREATE INDEX jobs_fair_queued ON jobs (queue, fair_key, id)
WHERE state = 'queued' AND fair_key IS NOT NULL;
