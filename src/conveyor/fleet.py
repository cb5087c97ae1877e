"""The workers of a store as every surface shows them: each with how long it has been
silent and the running jobs the store says it holds (``app.workers()``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.job import Job, JobState
from conveyor.store.protocols import OperatorStore
from conveyor.store.records import JobSelection, Page, WorkerInfo
from conveyor.store.worker_control import WorkerControlStore, control_changes, read_control

#: A worker that has not checked in for this long is probably dead: it beats every
#: third of its lease (10 s at the default 30 s), so this is three missed beats.
SILENT_AFTER = timedelta(seconds=30)
#: A worker silent for this long leaves every list (the dashboard, ``conveyor stats``,
#: /metrics), whether or not a live worker's maintenance has pruned its row yet (it
#: does so after at least as long).
FORGET_AFTER = timedelta(seconds=60)
#: The most running jobs read to tell which worker holds what.
MAX_HELD_READ = 10_000


@dataclasses.dataclass(frozen=True)
class WorkerStatus:
    """A registered worker, how long it has been silent, and the running jobs it holds."""

    info: WorkerInfo
    silent_for: float
    jobs: list[Job]

    @property
    def probably_dead(self) -> bool:
        return self.silent_for > SILENT_AFTER.total_seconds()

    @property
    def quiet(self) -> bool:
        """Asked to claim nothing new (``conveyor workers quiet``)."""
        return bool(self.info.control.get("quiet"))

    @property
    def concurrency(self) -> int:
        """Its slots: as it started, or as an operator asked since."""
        asked = self.info.control.get("concurrency")
        return asked if isinstance(asked, int) else self.info.concurrency


def worker_statuses(
    store: OperatorStore, now: datetime, attach: Callable[[Job], Job]
) -> list[WorkerStatus]:
    """The registered workers, each with the running jobs the store says it holds.

    The one count of a worker's jobs that every surface shows (a dead worker's
    last check-in may name jobs since rescued). Workers silent for over
    FORGET_AFTER are left out, pruned or not.
    """
    listed = [w for w in store.worker_list() if now - w.last_seen_at <= FORGET_AFTER]
    held: dict[str, list[Job]] = {w.id: [] for w in listed}
    if listed:
        running = JobSelection(state=str(JobState.RUNNING))
        for job in sorted(store.job_select(running, now, Page(MAX_HELD_READ)), key=lambda j: j.id):
            if job.worker in held:
                held[job.worker].append(attach(job))
    return [
        WorkerStatus(w, max(0.0, (now - w.last_seen_at).total_seconds()), held[w.id])
        for w in listed
    ]


def control_worker(
    store: WorkerControlStore,
    worker_id: str,
    quiet: bool | None = None,
    stop: bool | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """Ask a worker to go quiet (or claim again), to stop, or to run ``concurrency`` slots;
    it obeys at its next check-in. What is asked of it now; ConfigurationError for a
    worker that is not registered."""
    control = store.worker_control(worker_id, control_changes(quiet, stop, concurrency))
    if control is None:
        raise ConfigurationError(
            f"no worker {worker_id!r} is registered (see conveyor workers list)"
        )
    return read_control(control)
