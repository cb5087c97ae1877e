"""Shorthands for tests: ending jobs through ``Store.job_finish``, ticks, listing jobs."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from conveyor.job import Job, NewJob, retry_refusal, utcnow
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, JobSelection, Lease, Page, Purge


def Failure(  # named like the record it builds
    id: int, token: str, error: str, retry_at: datetime, retryable: bool = True
) -> Finish:
    """A failed attempt: retried at ``retry_at`` while attempts remain, unless not retryable."""
    if retryable:
        return Finish.retry(id, token, error, retry_at)
    return Finish.fail(id, token, error)


def released(leases: Iterable[Lease]) -> list[Finish]:
    return [Finish.release(lease.id, lease.token) for lease in leases]


def cancelled(leases: Iterable[Lease]) -> list[Finish]:
    return [Finish.cancelled(lease.id, lease.token) for lease in leases]


def record_tick(store: Store, task: str, tick: datetime) -> None:
    """Record ``tick`` as periodic task ``task``'s last, the way maintenance does (with its job)."""
    store.periodic_enqueue(task, tick, NewJob("default", task, "[]", "{}", tick), tick)


def cancel_one(store: Store, job_id: int, now: datetime) -> Job | None:
    """Cancel one job the way the App does (the bulk cancel with one id); the job after."""
    store.job_cancel_many([job_id], now)
    return store.job_get(job_id)


def retry_one(store: Store, job_id: int, now: datetime) -> Job | None:
    """Retry one job the way the App does: JobStateError when it cannot be retried."""
    changed = store.job_retry_many([job_id], now)
    job = store.job_get(job_id)
    if job is not None and not changed:
        raise retry_refusal(job)
    return job


def listed(
    store: Store, *, before_id: int | None = None, limit: int = 100, **filters: Any
) -> list[Job]:
    """A page of jobs newest first, the way the App lists them (``job_select``)."""
    return store.job_select(JobSelection(**filters), utcnow(), Page(limit, before_id))


def purge(store: Store, finished_before: datetime, limit: int = 10_000) -> int:
    """Delete up to ``limit`` jobs in any final state finished before the time."""
    return store.job_purge_where(
        Purge(finished_before, ("succeeded", "failed", "cancelled")), limit
    )
