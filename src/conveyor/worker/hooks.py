"""What a handler's Context asks of whoever runs its job, straight to the store.

One set of hooks for the worker and inline mode: the worker only adds its own
way of renewing a lease (its control loop hears what a renewal learns) and of
telling this process's listeners of progress.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from conveyor.job import Job, utcnow
from conveyor.logs import job_fields
from conveyor.store.capabilities import signal_store
from conveyor.store.records import Lease, Relative, Step
from conveyor.store.signals import SignalStore, SignalWait
from conveyor.worker import effects
from conveyor.worker.runtime import Runtime

log = logging.getLogger("conveyor.worker")


class StoreHooks:
    """A Context's hooks (``conveyor.context.Hooks``) that write to the runtime's store."""

    def __init__(self, runtime: Runtime, lease: timedelta) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self._lease = lease

    def write_progress(self, job: Job, fraction: float | None, message: str | None) -> bool:
        return self.store.job_progress(job_lease(job), fraction, message, utcnow())

    def publish_progress(self, job: Job, fraction: float | None, message: str | None) -> None:
        return None  # inline: nobody else waits in this thread while the handler runs

    def heartbeat(self, job: Job) -> bool:
        return bool(self.store.job_heartbeat([job_lease(job)], self._lease, utcnow()))

    def throttle(self, job: Job, seconds: float, whole_queue: bool) -> datetime:
        """``ctx.throttle()``: hold the job's limit key (or queue) back, for every worker."""
        return throttle_job(self.runtime, job, seconds, whole_queue)

    def parents(self, job: Job) -> list[Relative]:
        """``ctx.upstream``: the jobs this one waited for."""
        return self.runtime.parent_edges(job.id)

    def steps(self, job: Job) -> list[Step]:
        steps = effects.steps(self.store, job)
        codec = self.runtime.codec
        return steps if codec is None else [codec.open_step(step) for step in steps]

    def record_step(
        self, job: Job, name: str, result_json: str, started_at: datetime
    ) -> Step | None:
        codec = self.runtime.codec
        if codec is None:
            return effects.record_step(self.store, job, name, result_json, started_at)
        step = effects.record_step(self.store, job, name, codec.seal(result_json), started_at)
        return None if step is None else codec.open_step(step)

    def jobs(self, ids: list[int]) -> list[Job]:
        return [self.runtime.attach(job) for job in self.store.job_get_many(ids)]

    def park_children(
        self, job: Job, step: str, children: list[int], until: datetime
    ) -> str | None:
        store = signal_store(self.store, "wait for child jobs (ctx.wait)")
        return store.children_park(job_lease(job), step, children, until, utcnow())

    def mark_sleep(
        self, job: Job, step: str, until: datetime, over_from: datetime
    ) -> datetime | None:
        if not isinstance(self.store, SignalStore):
            return until  # a store without waits: the sleep is not shown as one
        return self.store.sleep_mark(job_lease(job), step, until, over_from)

    def wait_signal(self, job: Job, name: str, step: str, until: datetime) -> SignalWait | None:
        store = signal_store(self.store, "wait for signals (ctx.wait_for)")
        return store.signal_wait(job_lease(job), name, step, until, utcnow())

    def complete_in(self, job: Job, connection: Any, result_json: str) -> bool:
        codec = self.runtime.codec
        sealed = result_json if codec is None else codec.seal(result_json)
        return effects.complete_in(self.store, job, connection, sealed)


def throttle_job(runtime: Runtime, job: Job, seconds: float, whole_queue: bool) -> datetime:
    """Hold back the job's limit key (its queue when it has none, or ``whole_queue``)."""
    key = None if whole_queue else job.limit_key
    until = runtime.throttle(job.queue, seconds, key)
    what = f"queue {job.queue!r}" if key is None else f"key {key!r} of queue {job.queue!r}"
    log.warning("job %s throttled %s for %gs (until %s)", job.id, what, seconds,
                until.strftime("%H:%M:%S"), extra=job_fields(job))  # fmt: skip
    return until


def job_lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)
