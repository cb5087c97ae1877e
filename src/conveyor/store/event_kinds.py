"""The event kinds of the changes that are not finishes, by the state they leave a job in,
and the one of a job whose data a store could not read."""

from __future__ import annotations

from conveyor.job import EventKind, JobState

# The event each action other than finishing records, by the state the job is
# in afterwards (finishing has its own rule: event_insert_finished in each
# backend's queries). A claim records none: the event that ends the attempt
# carries its start (event_list in shared.sql).
EVENT_KINDS: dict[str, dict[str, str]] = {
    "cancel": {
        JobState.CANCELLED: EventKind.CANCELLED,
        JobState.RUNNING: EventKind.CANCEL_REQUESTED,
    },
    "retry": {JobState.QUEUED: EventKind.MANUAL_RETRY},
    "run_now": {JobState.QUEUED: EventKind.RUN_NOW},
    "hold": {JobState.QUEUED: EventKind.HELD},
    "unhold": {JobState.QUEUED: EventKind.UNHELD},
}

# A job whose data cannot be read leaves the store with one event of kind
# "dropped" (EventKind.DROPPED), whose error says why. Only Redis can lose a
# job's data from under its indexes (a hash deleted by hand or evicted) or hold
# an incomplete one; its scripts write these reasons (drop in common.lua).
DROPPED_MISSING = "job data missing (deleted or evicted)"
#: Followed by the missing fields: "job data incomplete (no priority, run_at)".
DROPPED_INCOMPLETE = "job data incomplete (no "
