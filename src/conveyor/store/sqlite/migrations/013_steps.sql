-- A job's durable steps (ctx.step): the result of each named step its handler
-- finished, kept so that a later attempt of the same job returns it instead
-- of running the step again. Foreign keys are off on conveyor's connections,
-- so a trigger deletes a job's steps with the job: every statement that
-- deletes jobs (purges, the archive, bulk deletes) takes them along.
CREATE TABLE job_steps (
    job_id      INTEGER NOT NULL,
    name        TEXT    NOT NULL,
    result      TEXT    NOT NULL,
    -- The attempt that ran the step, and when it ran (epoch seconds).
    attempt     INTEGER NOT NULL,
    started_at  REAL    NOT NULL,
    finished_at REAL    NOT NULL,
    PRIMARY KEY (job_id, name)
) WITHOUT ROWID;

CREATE TRIGGER job_steps_gone AFTER DELETE ON jobs
BEGIN
    DELETE FROM job_steps WHERE job_id = old.id;
END;
