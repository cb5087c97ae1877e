-- The audit: operators' actions (retry, cancel, purge, pause, limits, ...) with
-- who, from where, on what and how many jobs. Written only by those actions,
-- never by a job's own enqueue, claim or finish.
CREATE TABLE audit_log (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    actor   text        NOT NULL,
    source  text        NOT NULL,
    action  text        NOT NULL,
    target  text        NOT NULL,
    jobs    bigint
);
