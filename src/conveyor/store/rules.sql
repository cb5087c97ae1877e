-- Rules of the state machine that read the same in both SQL dialects, written
-- once and included by each dialect's queries.sql as
-- {{conveyor.store/rules.sql:name}}. Rules that differ only by a dialect's
-- clock or parameters are written once per dialect, next to their statements.

-- name: finish_requeues
-- Whether an outcome f (a row of a finish's items) puts the running job back
-- in the queue: snooze and release always (they give the attempt back), a
-- failed attempt (retry, rescue, take_back) while attempts remain; never a job
-- whose cancel was requested (it ends cancelled, unless it succeeded).
NOT jobs.cancel_requested AND (f.kind IN ('snooze', 'release')
    OR (f.kind IN ('retry', 'rescue', 'take_back') AND jobs.attempts < jobs.max_attempts))

-- name: finish_event_kind
-- The event a finished job's row gets, for outcome f, by the state the job is
-- in now (state) and the event's ordinal: a rescue that did not queue the job
-- again records "rescued" and then (ordinal 2) how the job ended.
CASE WHEN ordinal = 2 THEN state
     WHEN f.kind IN ('rescue', 'take_back') THEN 'rescued'
     WHEN state <> 'queued' THEN state
     WHEN f.kind = 'retry' THEN 'retried'
     WHEN f.kind = 'snooze' THEN 'snoozed'
     ELSE 'released' END

-- name: retry_key_rule
-- A manual retry takes keyed job j back only when it is the newest job of its
-- key and no live job holds the key: two retried jobs of one key would both be live.
(j.key IS NULL OR (
    j.id = (SELECT max(o.id) FROM jobs AS o WHERE o.queue = j.queue AND o.key = j.key)
    AND NOT EXISTS (SELECT 1 FROM jobs AS other
                    WHERE other.queue = j.queue AND other.key = j.key
                      AND other.state IN ('queued', 'running'))))

-- name: manual_requeue
-- What a manual retry sets: the job is queued again as new, due now.
state = 'queued',
attempts = 0,
run_at = {{now}},
cancel_requested = false,
worker = NULL,
result = NULL,
error = NULL,
progress = NULL,
progress_message = NULL,
started_at = NULL,
finished_at = NULL
