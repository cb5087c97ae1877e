"""The event kinds of the changes that are not finishes, by the state they leave a job in."""

from __future__ import annotations

from conveyor.job import EventKind, JobState

# The event each action other than finishing records, by the state the job is
# in afterwards (finishing has its own rule: event_insert_finished in each
# backend's queries).
EVENT_KINDS: dict[str, dict[str, str]] = {
    "claim": {JobState.RUNNING: EventKind.CLAIMED},
    "cancel": {
        JobState.CANCELLED: EventKind.CANCELLED,
        JobState.RUNNING: EventKind.CANCEL_REQUESTED,
    },
    "retry": {JobState.QUEUED: EventKind.MANUAL_RETRY},
    "run_now": {JobState.QUEUED: EventKind.RUN_NOW},
}
