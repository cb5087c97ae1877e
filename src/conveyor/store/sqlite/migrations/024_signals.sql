-- Signals and parked waits (app.signal, ctx.wait_for; docs/durable.md).
-- job_signals: the payloads sent to a job, kept until a wait of the job takes
-- one; a taken signal keeps when and by which step it was taken, so that each
-- is taken once. job_waits: what a parked job waits for (one row per job):
-- the step that waits, the signal's name, and until when. Foreign keys are off
-- on conveyor's connections: a trigger deletes both with the job.
CREATE TABLE job_signals (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    sent_at     REAL    NOT NULL,
    received_at REAL,
    step        TEXT
);
CREATE INDEX job_signals_pending ON job_signals (job_id, name, id) WHERE received_at IS NULL;

CREATE TABLE job_waits (
    job_id   INTEGER PRIMARY KEY,
    step     TEXT    NOT NULL,
    signal   TEXT,
    -- The children waited for (JSON ids), for ctx.wait.
    children TEXT,
    until    REAL    NOT NULL
);

CREATE TRIGGER job_signals_gone AFTER DELETE ON jobs
BEGIN
    DELETE FROM job_signals WHERE job_id = old.id;
    DELETE FROM job_waits WHERE job_id = old.id;
END;
