-- Workflows: jobs that wait for other jobs (enqueue option after=, declared
-- graphs). See docs/workflows.md.
--
-- A new state, waiting: enqueued after jobs that have not all succeeded yet.
-- It is in none of the claim's indexes (they hold queued jobs only), so claims
-- never read it. The CHECK is added NOT VALID and then validated: the check of
-- the existing rows does not block writes meanwhile.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'waiting'))
    NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_state_check;

-- A waiting job holds its key as a queued one does. The enqueue's ON CONFLICT
-- (state IN ('queued', 'running')) implies this predicate, so it still finds
-- the index.
DROP INDEX jobs_live_key;
CREATE UNIQUE INDEX jobs_live_key ON jobs (queue, key)
    WHERE key IS NOT NULL AND state IN ('queued', 'running', 'waiting');

-- One row per edge: child waits for parent. resolved is NULL until the parent
-- ends, then the state it ended in; an edge is resolved once, whatever happens
-- to the parent later (a manual retry). Read both ways: a parent's children
-- when it ends, a child's parents for ctx.upstream and the job page. No
-- foreign keys: their checks, a trigger per row, tripled the cost of enqueueing
-- a graph; the enqueue checks its parents itself, and deleting jobs deletes
-- their edges and flow rows (jobs_forget_flows, below).
CREATE TABLE job_edges (
    child    bigint NOT NULL,
    parent   bigint NOT NULL,
    resolved text,
    PRIMARY KEY (child, parent)
);
CREATE INDEX job_edges_parent ON job_edges (parent, child);

-- One row per job that waits for others or belongs to a declared workflow.
-- pending: its parents not yet ended, counted down by their finishes, so that
-- the last parent's finish knows at once (not by counting edges) that the
-- child may run. on_failure: what a parent's failure does to it ('cancel' or
-- 'run').
CREATE TABLE job_flows (
    job_id     bigint PRIMARY KEY,
    pending    integer NOT NULL DEFAULT 0,
    on_failure text    NOT NULL DEFAULT 'cancel',
    workflow   text
);
CREATE INDEX job_flows_workflow ON job_flows (workflow, job_id) WHERE workflow IS NOT NULL;

-- Declared workflows: a graph enqueued at once under an id (a repeated enqueue
-- with the same id returns this one).
CREATE TABLE workflows (
    id         text PRIMARY KEY,
    name       text NOT NULL,
    jobs       integer NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX workflows_created ON workflows (created_at);

-- Whatever deletes jobs (retention, an operator, a queue's deletion) deletes
-- their edges and flow rows: once per statement, over the rows it deleted.
CREATE FUNCTION conveyor_forget_flows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_edges WHERE child IN (SELECT id FROM gone);
    DELETE FROM job_edges WHERE parent IN (SELECT id FROM gone);
    DELETE FROM job_flows WHERE job_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_forget_flows AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_forget_flows();
