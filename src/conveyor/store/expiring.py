"""The capability of a store whose jobs can have a deadline to start by (expiry.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

from conveyor.expiry import EXPIRE_LIMIT


@runtime_checkable
class ExpiringStore(Protocol):
    """Jobs enqueued with ``expires=``: their deadlines read, the expired ones ended.

    The insert writes a job's deadline (``NewJob.expires_at``) with its row, in
    the insert's own transaction or script; the claim passes by a job whose
    deadline has passed.
    """

    def job_expire(self, now: datetime | None = None, limit: int = EXPIRE_LIMIT) -> list[int]:
        """End up to ``limit`` queued jobs whose deadline is at or before ``now`` (None:
        the store's clock): ``cancelled`` with ``EXPIRED_ERROR``, each with its
        event, the jobs waiting for them resolved. Returns their ids."""
        ...

    def job_expires_at(self, job_ids: Sequence[int]) -> dict[int, datetime]:
        """The deadlines of those of ``job_ids`` that have one."""
        ...

    def job_expired_counts(self) -> dict[str, int]:
        """The jobs that expired and are still kept (cancelled with ``EXPIRED_ERROR``),
        per queue; read from an index of those alone."""
        ...


def expired_counts(port: ExpiringStore | None) -> dict[str, int] | None:
    """Expired jobs per queue, or None for a store without expiry (``app.expiry``)."""
    return None if port is None else port.job_expired_counts()


def deadline_of(port: ExpiringStore | None, job_id: int) -> datetime | None:
    """A job's deadline to start by, or None (none set, or a store without expiry)."""
    return None if port is None else port.job_expires_at([job_id]).get(job_id)
