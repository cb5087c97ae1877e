-- The column of PostgreSQL's migration 023 (enqueue counts), so that both stores'
-- events have the same columns. SQLite still writes an enqueued event per job
-- (NULL here: one job); event_list shows a job's enqueue from its created_at on
-- both stores.
ALTER TABLE events ADD COLUMN jobs INTEGER;
