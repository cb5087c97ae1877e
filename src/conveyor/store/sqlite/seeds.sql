-- Statements of retention per final state, holding a job back, and outcome readers.
-- Kept apart from queries.sql: each is new, none changes a statement there.

-- name: job_purge_beyond_in_states
-- The jobs of a queue in :states (final states, as JSON) past its :keep newest
-- of them (by id, the order they were enqueued), up to :limit of them.
SELECT id FROM jobs
WHERE queue = :queue AND state IN (SELECT value FROM json_each(:states))
ORDER BY id DESC
LIMIT :limit OFFSET :keep
