-- Keyset pages of the job list (newest first) filtered by state or by queue:
-- with these, a page of failed jobs among a million reads one index range
-- instead of walking the whole table from the newest id down.
CREATE INDEX jobs_state_id ON jobs (state, id);
CREATE INDEX jobs_queue_id ON jobs (queue, id);
