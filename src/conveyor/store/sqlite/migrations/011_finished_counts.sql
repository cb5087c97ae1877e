-- The finished jobs of each queue, counted without reading them: the dashboard's
-- counts, `conveyor stats` and /metrics read this table (plus the few events
-- since it was last brought up to date) instead of every finished job's index
-- entry, so they cost the same at a thousand jobs and at a hundred million.
--
-- jobs: the finished jobs of (queue, state), less those not yet added because
-- their events come after finished_counts_folded.seq. Stats adds those events
-- (kinds succeeded, failed, cancelled) at read time, and folds them in now and
-- then. A worker's finish writes nothing here (its event is what counts), so no
-- row is updated by every finish. A manual retry takes its job off its state's
-- count at once; a delete takes its jobs off and adds back their deleted events
-- that were not yet folded (see finished_counts_forget).
CREATE TABLE finished_counts (
    queue TEXT    NOT NULL,
    state TEXT    NOT NULL,
    jobs  INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;

-- One row: the newest event counted into finished_counts.
CREATE TABLE finished_counts_folded (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    seq INTEGER NOT NULL
);

-- An existing database: count what is there now, under the migration's write
-- lock, so every event so far is folded.
INSERT INTO finished_counts (queue, state, jobs)
SELECT queue, state, count(*) FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled')
GROUP BY queue, state;

INSERT INTO finished_counts_folded (one, seq) SELECT 1, coalesce(max(seq), 0) FROM events;

-- The queued jobs' index also holds run_at, so stats read every queued job's
-- due time (ready, oldest ready, due later) from the index alone. Same order,
-- same use by the claim; no index more for a write to keep.
DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (queue, priority DESC, id, run_at) WHERE state = 'queued';
