"""Replace and debounce: an enqueue of a key that updates the job holding it.

``on_conflict="replace"`` (with a ``key``): the queued job holding the key takes
this enqueue's arguments, ``run_at`` and priority in place, with a ``replaced``
event, and the enqueue returns it (``job.existing``). A job already running is
never changed: it gives its key up and the enqueue inserts a new job with it.
A waiting job (``after=``) answers as with the default ``"answer"``.

``debounce=`` (seconds or a ``timedelta``, with a ``key``) is a replace whose
job is due that long after each enqueue: a burst of enqueues of one key
becomes one job, run once the window has passed with no new enqueue, with the
last enqueue's arguments.

The stores decide in their own statements or script (replace.sql, the insert
script on Redis); nothing here writes.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from conveyor.errors import InvalidJobError
from conveyor.job import OnConflict


def check_on_conflict(on_conflict: object, key: str | None) -> OnConflict:
    if on_conflict not in ("answer", "replace"):
        raise InvalidJobError(f"on_conflict must be 'answer' or 'replace', got {on_conflict!r}")
    if on_conflict == "replace" and key is None:
        raise InvalidJobError("on_conflict='replace' needs a key: the job it replaces holds it")
    return "replace" if on_conflict == "replace" else "answer"


def debounced_run_at(
    now: datetime, debounce: object, key: str | None, delay: object, run_at: object
) -> datetime:
    """When a debounced job is due: ``debounce`` after this enqueue."""
    if key is None:
        raise InvalidJobError("debounce needs a key: enqueues of one key become one job")
    if delay is not None or run_at is not None:
        raise InvalidJobError("debounce sets when the job is due: give no delay or run_at")
    seconds = debounce.total_seconds() if isinstance(debounce, timedelta) else debounce
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise InvalidJobError(
            f"debounce must be a positive number of seconds or a timedelta, got {debounce!r}"
        )
    return now + timedelta(seconds=seconds)
