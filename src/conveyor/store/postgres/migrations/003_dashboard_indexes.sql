-- Keyset pages of the job list (newest first) filtered by state, or by queue
-- and state: with these, a page of failed jobs among a million reads one index
-- range instead of walking the whole table from the newest id down. The second
-- also answers the overview's counts per queue and state from the index alone.
CREATE INDEX IF NOT EXISTS jobs_state_id ON jobs (state, id);
CREATE INDEX IF NOT EXISTS jobs_queue_state ON jobs (queue, state, id);
-- IF NOT EXISTS: on a big live table, build them first with CREATE INDEX
-- CONCURRENTLY (PostgreSQL) and this migration keeps them.
