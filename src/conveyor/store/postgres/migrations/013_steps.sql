-- A job's durable steps (ctx.step): the result of each named step its handler
-- finished, kept so that a later attempt of the same job returns it instead
-- of running the step again. Deleted with the job (ON DELETE CASCADE), so that
-- every statement that deletes jobs (purges, the archive, bulk deletes) takes
-- their steps along without naming them. json like results (given back as sent).
CREATE TABLE job_steps (
    job_id      bigint      NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    result      json        NOT NULL,
    -- The attempt that ran the step, and when it ran.
    attempt     integer     NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, name)
);
