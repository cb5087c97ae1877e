-- What operators look up and act on: the jobs of one group (listing, counting,
-- cancelling a session's pending jobs, taking back its running one).
--
-- The group index holds grouped jobs only, so jobs without a group cost nothing more.
CREATE INDEX jobs_group ON jobs (group_key, id) WHERE group_key IS NOT NULL;
