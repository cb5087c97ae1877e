-- A job that other jobs wait for says so on its own row. The finish of a job
-- nothing waits for is then one statement (job_finish), with no transaction
-- around it and no search of job_edges after it; a job with children is
-- finished by the same statement inside a transaction that resolves its edges
-- (see job_finish in queries.sql for why the flag must be on the row).
-- Adding a column with a constant default rewrites nothing.
ALTER TABLE jobs ADD COLUMN waited_on boolean NOT NULL DEFAULT false;
UPDATE jobs SET waited_on = true
WHERE id IN (SELECT parent FROM job_edges WHERE resolved IS NULL);
