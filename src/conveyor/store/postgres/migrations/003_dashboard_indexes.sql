-- Keyset pages of the job list (newest first) by queue and state: a page of a
-- queue's failed jobs among a million reads one index range instead of walking
-- the table from the newest id down; a state across queues is one short walk
-- per queue. It also answers the counts per queue and state from the index
-- alone. One index, not one more per filter: each is moved on every state change
-- a worker makes.
CREATE INDEX IF NOT EXISTS jobs_queue_state ON jobs (queue, state, id);
-- IF NOT EXISTS: on a big live table, build it first with CREATE INDEX
-- CONCURRENTLY (PostgreSQL) and this migration keeps it.
