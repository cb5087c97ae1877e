-- The queued jobs of one limit key, oldest first: a claim of a queue with a
-- per-key limit counts, for each candidate job, its key's older ready jobs (only
-- a key's oldest jobs, as many as it has room for, are claimable). Kept apart
-- from jobs_limit_key (which also holds every finished job of a key) so that
-- the planner finds it best whatever its statistics say: without it, a table
-- that had just grown was searched along the whole queue's jobs_queued for each
-- candidate. Partial: queued jobs with a limit key only.
CREATE INDEX jobs_limit_queued ON jobs (queue, limit_key, id)
    WHERE state = 'queued' AND limit_key IS NOT NULL;
