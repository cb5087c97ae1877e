-- The audit: operators' actions (retry, cancel, purge, pause, limits, ...) with
-- who, from where, on what and how many jobs. Written only by those actions,
-- never by a job's own enqueue, claim or finish.
CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      REAL    NOT NULL,
    actor   TEXT    NOT NULL,
    source  TEXT    NOT NULL,
    action  TEXT    NOT NULL,
    target  TEXT    NOT NULL,
    jobs    INTEGER
);
