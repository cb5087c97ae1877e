"""Retention per task and per job: how long a job is kept once it has finished.

``retain=`` on a task or an enqueue (one duration for every final state, or a
mapping of final states to durations: seconds or ``timedelta``) overrides the
queue's age rules (``App(retention=..., retention_by_state=...)``) for the
states it names; 0 deletes the job at the next maintenance round after it
finishes (BullMQ's ``removeOnComplete: true``). The rule is stored with the job
(``jobs.retain``, a field of its hash on Redis, written only when set) as JSON,
``{"succeeded": 3600.0, "failed": 2592000.0}``, and each store's retention
statement or script judges ``finished_at + retain[state] <= now`` itself
(``RetainingStore.job_purge_retained``). The count rules (``keep_finished``, a
``Keep``'s count) still cap every job.

Nothing here writes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import timedelta

from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import TERMINAL_STATES

#: The final states a rule may name, in a stable order.
RETAINED_STATES = tuple(sorted(str(s) for s in TERMINAL_STATES))
#: Longest a job's own rule may keep it (within every store's number types).
MAX_RETAIN = timedelta(days=36_500)
#: Jobs one round of job_purge_retained deletes at most; the next round goes on.
RETAIN_PURGE_LIMIT = 10_000

Duration = float | int | timedelta
Retain = Duration | Mapping[str, Duration]


def _seconds(state: str, value: object) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidJobError(
            f"retain[{state!r}] must be seconds or a timedelta, got {type(value).__name__}"
        )
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_RETAIN.total_seconds():
        raise InvalidJobError(
            f"retain[{state!r}] must be from 0 to {MAX_RETAIN.days} days, got {seconds} seconds"
        )
    return float(seconds)


def resolve_retain(retain: object) -> str | None:
    """The stored form of a ``retain=`` option (JSON of state -> seconds), or None."""
    if retain is None:
        return None
    if isinstance(retain, Mapping):
        unknown = sorted(str(s) for s in retain if s not in RETAINED_STATES)
        if unknown:
            raise InvalidJobError(
                f"retain names states that are not final: {', '.join(unknown)} "
                f"(final states: {', '.join(RETAINED_STATES)})"
            )
        if not retain:
            raise InvalidJobError("retain must name at least one final state")
        rule = {str(s): _seconds(str(s), retain[s]) for s in RETAINED_STATES if s in retain}
    else:
        rule = {s: _seconds(s, retain) for s in RETAINED_STATES}
    return json.dumps(rule, separators=(",", ":"))


def check_task_retain(task: str, retain: object) -> Retain | None:
    """A task's default ``retain``, checked when the task is registered."""
    try:
        resolve_retain(retain)
    except InvalidJobError as exc:
        raise ConfigurationError(f"task {task!r}: {exc}") from None
    return retain  # type: ignore[return-value]  # checked just above


def read_retain(stored: str | None) -> dict[str, timedelta] | None:
    """A stored rule as durations by state (None: the job follows its queue's policy)."""
    if not stored:
        return None
    return {state: timedelta(seconds=s) for state, s in json.loads(stored).items()}


def describe_retain(rule: Mapping[str, timedelta]) -> str:
    """One line for ``conveyor jobs show`` and the job page: ``failed 30d, succeeded 1h``."""
    return ", ".join(f"{state} {_short(age)}" for state, age in sorted(rule.items()))


def _short(age: timedelta) -> str:
    seconds = age.total_seconds()
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return "at once" if seconds == 0 else f"{seconds:g}s"
