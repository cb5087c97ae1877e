-- SQLite's migration 005 rebuilt its jobs table to rewrite a CHECK constraint
-- that PostgreSQL evaluates cheaply as it is. Nothing changes here; the number is
-- taken so that a schema version means the same step on both databases.
SELECT 1;
