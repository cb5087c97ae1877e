-- PostgreSQL's migration 017 replaced its delete trigger so that the edges of
-- children onto a deleted parent stay, marked deleted. SQLite's store does that
-- in the statements that delete jobs (flow_forget_parents). Nothing changes here;
-- the number is taken so that a schema version means the same step on both
-- databases.
SELECT 1;
