-- The finished jobs of each queue, counted without reading them: the dashboard's
-- counts, `conveyor stats` and /metrics read this table (plus the few events
-- since it was last brought up to date) instead of every finished job's index
-- entry, so they cost the same at a thousand jobs and at a hundred million.
--
-- jobs: the finished jobs of (queue, state), less those not yet added because
-- their events come after the offset in finished_counts_folded. Stats adds those
-- events (kinds succeeded, failed, cancelled) at read time, and folds them in
-- now and then, in (xid, seq) order and only below the oldest transaction still
-- running, as /metrics counts events. A worker's finish writes nothing here (its
-- event is what counts), so no row is updated by every finish. A manual retry
-- takes its job off its state's count at once; a delete takes its jobs off and
-- adds back their deleted events that were not yet folded.
CREATE TABLE finished_counts (
    queue text   NOT NULL,
    state text   NOT NULL,
    jobs  bigint NOT NULL,
    PRIMARY KEY (queue, state)
);

-- One row: the offset (xid, seq) of the newest event counted into
-- finished_counts. A fold locks it (and skips when another fold holds it); a
-- delete locks it too, so that it agrees with the folds on which events are in.
CREATE TABLE finished_counts_folded (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    xid xid8   NOT NULL,
    seq bigint NOT NULL
);

-- An existing database, in one statement (one snapshot): the offset stops just
-- below the oldest transaction still running, so every event of a transaction
-- this snapshot cannot see comes after it; the counts are the finished jobs the
-- snapshot sees, less the finishing events after the offset that it sees too
-- (stats add those back).
WITH snapshot AS (
    SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin
), folded AS (
    INSERT INTO finished_counts_folded (xid, seq)
    SELECT (xmin::text::bigint - 1)::text::xid8, 9223372036854775807 FROM snapshot
)
INSERT INTO finished_counts (queue, state, jobs)
SELECT queue, state, sum(n) FROM (
    SELECT queue, state, count(*) AS n FROM jobs
    WHERE state IN ('succeeded', 'failed', 'cancelled')
    GROUP BY queue, state
    UNION ALL
    SELECT e.queue, e.kind, -count(*) FROM events AS e, snapshot
    WHERE e.xid >= snapshot.xmin AND e.kind IN ('succeeded', 'failed', 'cancelled')
    GROUP BY e.queue, e.kind
) AS counted
GROUP BY queue, state
HAVING sum(n) <> 0;

-- The queued jobs' index also holds run_at, so stats read every queued job's
-- due time (ready, oldest ready, due later) from the index alone. Same order,
-- same use by the claim; no index more for a write to keep.
DROP INDEX jobs_queued;
CREATE INDEX jobs_queued ON jobs (queue, priority DESC, id, run_at) WHERE state = 'queued';
