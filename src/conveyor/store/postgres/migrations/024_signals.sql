-- Signals and parked waits (app.signal, ctx.wait_for; docs/durable.md).
-- job_signals: the payloads sent to a job, kept until a wait of the job takes
-- one; a taken signal keeps when and by which step it was taken, so that each
-- is taken once. job_waits: what a parked job waits for (one row per job):
-- the step that waits, the signal's name, and until when. Both are deleted
-- with the job (ON DELETE CASCADE).
CREATE TABLE job_signals (
    id          bigserial   PRIMARY KEY,
    job_id      bigint      NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     text        NOT NULL,
    sent_at     timestamptz NOT NULL,
    received_at timestamptz,
    step        text
);
CREATE INDEX job_signals_pending ON job_signals (job_id, name, id) WHERE received_at IS NULL;
CREATE INDEX job_signals_job ON job_signals (job_id);

CREATE TABLE job_waits (
    job_id   bigint      PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    step     text        NOT NULL,
    signal   text,
    -- The children waited for (JSON ids), for ctx.wait.
    children text,
    until    timestamptz NOT NULL
);
