"""Expiry: a deadline by which a job must have started, or never start at all.

``expires=`` (seconds or a ``timedelta`` from the enqueue, or an aware ``datetime``)
on a task or an enqueue gives a job its deadline (``jobs.expires_at``; a field
of the job's hash on Redis, written only when set). A job still queued at its
deadline ends ``cancelled`` with the error ``EXPIRED_ERROR``: the claim passes
it by (Redis's claim script ends it there and then), and the maintenance leader
ends those found in a round (``ExpiringStore.job_expire``), so that an expired
job does not wait for a worker to reach it. The deadline stays with the job
through its retries: a failed attempt queued again after it never starts.

Nothing here writes; the stores decide in their own statement or script.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import MAX_RUN_AT, Job, JobState, seconds_later

#: The error of a job that expired: the outcome a listing, the job page and
#: ``conveyor jobs show`` tell an expired job by (its state is ``cancelled``).
EXPIRED_ERROR = "expired: not started by its deadline (expires)"
#: What a listing's filter names to pick expired jobs out of the cancelled ones.
EXPIRED = "expired"
#: Expired jobs one maintenance round ends at most; the next round goes on.
EXPIRE_LIMIT = 1000

Expires = float | int | timedelta | datetime


def resolve_expires(now: datetime, run_at: datetime, expires: object) -> datetime | None:
    """The deadline ``expires`` gives a job enqueued at ``now`` and due at ``run_at``.

    A deadline at or before the job is due would make it a job that can never
    run: refused, as are naive datetimes and durations that are not positive.
    """
    if expires is None:
        return None
    if isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise InvalidJobError("expires must be timezone-aware (e.g. datetime.now(UTC))")
        deadline = expires.astimezone(UTC)
    else:
        seconds = expires.total_seconds() if isinstance(expires, timedelta) else expires
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidJobError(
                "expires must be seconds, a timedelta or an aware datetime, "
                f"got {type(expires).__name__}"
            )
        if not math.isfinite(seconds) or seconds <= 0:
            raise InvalidJobError(f"expires must be a positive number of seconds, got {seconds}")
        deadline = seconds_later(now, seconds)
    if deadline >= MAX_RUN_AT:
        raise InvalidJobError(f"expires is too far ahead: give a deadline before {MAX_RUN_AT}")
    if deadline <= run_at:
        raise InvalidJobError(
            f"expires ({deadline.isoformat()}) must be later than the job is due "
            f"({run_at.isoformat()}): the job could never start"
        )
    return deadline


def check_task_expires(task: str, expires: object) -> Expires | None:
    """A task's default ``expires``, checked when the task is registered."""
    if expires is None:
        return None
    try:
        resolve_expires(datetime.now(UTC), datetime.min.replace(tzinfo=UTC), expires)
    except InvalidJobError as exc:
        raise ConfigurationError(f"task {task!r}: {exc}") from None
    assert isinstance(expires, float | int | timedelta | datetime)
    return expires


def is_expired(job: Job) -> bool:
    """Whether ``job`` ended because it was not started by its deadline."""
    return job.state == JobState.CANCELLED and job.error == EXPIRED_ERROR
