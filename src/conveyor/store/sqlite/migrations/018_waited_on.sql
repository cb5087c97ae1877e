-- PostgreSQL's migration 018 added jobs.waited_on, so that its finish of a job
-- nothing waits for is one statement. SQLite's finish is one write transaction
-- with its edges whatever the job (one writer: no finish can race an enqueue),
-- so it needs no flag. Nothing changes here; the number is taken so that a
-- schema version means the same step on both databases.
SELECT 1;
