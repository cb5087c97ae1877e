-- A job's history no longer holds a row for its enqueue: event_list shows it
-- from the job's created_at. What the log's followers count of enqueues (the
-- per-task metrics, Spark's events) comes from one row per queue and task of
-- each enqueue statement: "enqueued", with how many jobs it made in this column
-- and the first of them in job_id (NULL on every other row, and on the enqueued
-- rows of one job each written before: a NULL counts one). A burst of a hundred
-- jobs so writes one event row, with its three index entries, instead of a
-- hundred.
ALTER TABLE events ADD COLUMN jobs integer;
