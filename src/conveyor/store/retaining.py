"""The capability of a store whose jobs can carry their own retention rule (retain.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from conveyor.retain import RETAIN_PURGE_LIMIT, describe_retain, read_retain


@runtime_checkable
class RetainingStore(Protocol):
    """Jobs enqueued with ``retain=``: their rules read, the finished jobs past them deleted.

    The insert writes a job's rule (``NewJob.retain``) with its row, in the
    insert's own transaction or script; the queue's age rules pass over a job
    whose rule names the state it ended in (``Purge.by_policy``).
    """

    def job_purge_retained(self, now: datetime, limit: int = RETAIN_PURGE_LIMIT) -> int:
        """Delete up to ``limit`` finished jobs whose own rule for the state they ended in
        has run out at ``now`` (parents of jobs yet to run stay), with their events."""
        ...

    def job_retain(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The stored rules (JSON, as retain.resolve_retain makes) of those of ``job_ids``
        that have one."""
        ...


def retain_of(store: object, job_id: int) -> str | None:
    """A job's own retention rule, or None (none set, or a store without the capability)."""
    if not isinstance(store, RetainingStore):
        return None
    return store.job_retain([job_id]).get(job_id)


def kept_for(store: object, job_id: int) -> dict[str, timedelta] | None:
    """A job's own retention as durations by final state (``conveyor jobs show``, the
    job page), or None: it follows its queue's policy."""
    return read_retain(retain_of(store, job_id))


def kept_line(store: object, job_id: int) -> str | None:
    """``kept_for`` in one line (``failed 30d, succeeded 1h``), or None."""
    kept = kept_for(store, job_id)
    return describe_retain(kept) if kept else None


def own_retention(store: object, now: datetime) -> int:
    """One round of the jobs' own rules (``app.apply_retention``); 0 on a store without."""
    return store.job_purge_retained(now) if isinstance(store, RetainingStore) else 0
