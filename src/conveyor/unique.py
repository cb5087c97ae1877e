"""Unique windows and states: how long, and in which states, a job keeps its key.

An enqueue with a ``key`` returns the job that holds the key instead of adding
one. Which jobs hold it:

- ``unique="live"`` (the default): a job of the key that is waiting, queued or
  running;
- ``unique="forever"``: also any finished job of the key, until it is purged;
- ``unique=Unique(period=timedelta(hours=1), states=[...])``: also the finished
  jobs of the key in ``states`` (default: succeeded and failed; a cancelled job
  lets the key go), and of those only one created within ``period`` before the
  enqueue (no period: any age). ``Unique(period=timedelta(hours=1))`` runs a
  key at most once an hour.

A live job of the key always holds it: a key never has two live jobs (the
stores' unique index on live keys, a write lock, a script), so concurrent
enqueues of one key give exactly one job under every policy.

``resolve_unique`` turns a policy into the fields of the NewJob (the finished
states and the earliest creation time that hold the key), which the stores'
key lookup reads in the enqueue's own transaction or script.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor.errors import InvalidJobError
from conveyor.job import TERMINAL_STATES, JobState

#: The finished states that hold a key under Unique() unless it names others.
DEFAULT_STATES = (JobState.SUCCEEDED.value, JobState.FAILED.value)
_FINISHED = tuple(sorted(s.value for s in TERMINAL_STATES))


@dataclass(frozen=True, slots=True)
class Unique:
    """A key held by the live job and by the finished jobs in ``states`` created within
    ``period`` (None: any age) before the enqueue."""

    period: timedelta | float | None = None
    states: Iterable[str] = DEFAULT_STATES


def resolve_unique(
    now: datetime, unique: object
) -> tuple[str, tuple[str, ...] | None, datetime | None]:
    """``unique`` as a NewJob carries it: its mode, the finished states that hold the
    key (None: the mode's rule), the earliest creation time that does (None: any)."""
    if unique in ("live", "forever"):
        return str(unique), None, None
    if not isinstance(unique, Unique):
        raise InvalidJobError(
            f"unique must be 'live', 'forever' or Unique(period=..., states=[...]), got {unique!r}"
        )
    if isinstance(unique.states, str):
        raise InvalidJobError("Unique states must be a list of states, not one string")
    states = tuple(dict.fromkeys(str(s) for s in unique.states))
    live = {s.value for s in JobState} - set(_FINISHED)
    wrong = [s for s in states if s not in _FINISHED and s not in live]
    if wrong:
        raise InvalidJobError(
            f"Unique states must be job states, got {', '.join(map(repr, wrong))}; "
            f"finished ones are {', '.join(_FINISHED)} (a live job always holds its key)"
        )
    finished = tuple(s for s in _FINISHED if s in states)
    since = None
    if unique.period is not None:
        period = unique.period
        seconds = period.total_seconds() if isinstance(period, timedelta) else period
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
            raise InvalidJobError(
                f"Unique period must be a positive timedelta or seconds, got {period!r}"
            )
        try:
            since = now - timedelta(seconds=seconds)
        except OverflowError:
            since = datetime.min.replace(tzinfo=now.tzinfo)
    return "live", finished, since
