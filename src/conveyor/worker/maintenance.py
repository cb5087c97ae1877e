"""Work that one worker at a time does for everyone: rescue, retention, periodic tasks, limits.

Every worker runs a Maintenance thread; only the holder of the leader lease
acts. The lease is a row with an expiry, renewed each round, so a leader that
dies or freezes is replaced within one lease. Every action is safe to run
twice: rescue is a compare-and-set, and a periodic tick is taken in the store,
in the transaction that enqueues its job, so it runs once whatever is purged,
restarted or handed over between leaders.

Each action fails on its own: a rescue that fails does not stop the periodic
ticks, and a round that fails is tried again after a pause.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from conveyor.job import NewJob, resolve_run_at, utcnow
from conveyor.pacing import DutyBackoff
from conveyor.store.expiring import ExpiringStore
from conveyor.store.metrics_protocol import FOLD_LIMIT, TaskMetricsStore
from conveyor.store.protocols import FlowControlStore, OperatorStore
from conveyor.store.retaining import RetainingStore
from conveyor.worker.retention import Housekeeping
from conveyor.worker.runtime import Runtime
from conveyor.worker.talk import log_rescued

log = logging.getLogger("conveyor.maintenance")

LEADER_NAME = "maintenance"
#: Seconds between two folds of the events into per-task metrics by the leader
#: (the dashboard and /metrics fold what is new before they read, too).
METRICS_EVERY = 60.0
#: Folds of FOLD_LIMIT events one maintenance round does at most.
METRICS_FOLDS = 4


def round_interval(lease: float) -> float:
    """How often to look for expired leases: one comes back within about a quarter of its
    length, and the database is never hammered."""
    return min(max(lease / 4, 0.05), 5.0)


class _Background:
    """A daemon thread running ``_run`` until ``stop()``, which waits for it."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        raise NotImplementedError


class Maintenance(_Background):
    def __init__(self, runtime: Runtime, holder: str, lease: float) -> None:
        self.runtime = runtime
        self.store = runtime.store
        self.holder = holder
        # Check often enough that an expired lease is rescued within about a
        # quarter of its length, but never hammer the database.
        self.interval = round_interval(lease)
        self.ttl = timedelta(seconds=max(self.interval * 3, 1.0))
        super().__init__("conveyor-maintenance")
        self.is_leader = False
        self._next_metrics = 0.0
        self._retention = Housekeeping(runtime.store, runtime.retention, holder, self.ttl)

    def stop(self) -> None:
        super().stop()
        self._retention.release()
        if self.is_leader:
            try:
                self.store.leader_release(LEADER_NAME, self.holder)
            except Exception:
                log.exception("could not release the maintenance lease")

    def _run(self) -> None:
        # A database restart or a locked file: try again, a little later each time.
        backoff = DutyBackoff(
            "maintenance round", log, first=self.interval, ceiling=self.interval * 8
        )
        while not self._stop.is_set():
            try:
                self.run_once()
                backoff.succeeded()
                pause = self.interval
            except Exception as exc:
                pause = backoff.failed(exc)
            self._stop.wait(pause)

    def run_once(self, now: datetime | None = None) -> None:
        """One round; ``now`` None: the store's clock judges leases, this machine's the rest."""
        store = self.store
        wall = now or utcnow()
        self.is_leader = store.leader_acquire(LEADER_NAME, self.holder, self.ttl, wall)
        if not self.is_leader:
            return
        actions: list[tuple[str, Callable[[], object]]] = [
            ("rescue", lambda: self._rescue(now)),
            ("worker list", lambda: store.worker_prune(wall - self._forget_after())),
            ("periodic tasks", lambda: self._enqueue_periodic(wall)),
        ]
        # Capabilities beyond the core: a store without them has nothing to do here.
        if isinstance(store, OperatorStore) and self.runtime.retention.enabled:
            actions.append(("retention", lambda: self._retention.run(wall)))
        if isinstance(store, RetainingStore):
            # Jobs kept as long as their own rule says (retain=): with or without a policy.
            actions.append(("own retention", lambda: store.job_purge_retained(wall)))
        if isinstance(store, ExpiringStore):
            # Jobs past their deadline end now, not when a worker would reach them.
            actions.append(("expiry", lambda: self._expire(store, now)))
        if isinstance(store, FlowControlStore):
            # Claims prune the starts of the queues they claim; this, the rest.
            actions.append(("limits", lambda: store.limit_prune(wall)))
        if isinstance(store, TaskMetricsStore) and time.monotonic() >= self._next_metrics:
            self._next_metrics = time.monotonic() + METRICS_EVERY
            actions.append(("per-task metrics", lambda: fold_and_prune(store, wall)))
        for name, action in actions:
            try:
                action()
            except Exception as exc:
                log.warning("maintenance: %s failed: %s", name, exc)

    def _forget_after(self) -> timedelta:
        return timedelta(seconds=max(self.ttl.total_seconds() * 10, 60))

    def _rescue(self, now: datetime | None) -> None:
        rescued = self.store.job_rescue_expired(now)
        log_rescued(log, self.store, rescued, "worker")

    def _expire(self, store: ExpiringStore, now: datetime | None) -> None:
        expired = store.job_expire(now)
        if expired:
            log.info("%d job(s) expired before they started: %s", len(expired), expired[:10])

    def _enqueue_periodic(self, now: datetime) -> None:
        for periodic in self.runtime.periodic:
            tick = periodic.schedule.last_tick(now)
            task = self.runtime.tasks.get(periodic.task)
            try:
                job = NewJob(
                    queue=task.queue if task else "default",
                    task=periodic.task,
                    args_json="[]",
                    kwargs_json="{}",
                    run_at=resolve_run_at(now, None, tick),
                    priority=task.priority if task else 0,
                    max_attempts=task.max_attempts if task else 3,
                    # The key shows which tick a job is; the store's tick row is what
                    # makes it run once.
                    key=f"periodic:{periodic.task}:{tick.isoformat()}",
                    unique="forever",
                )
                if self.store.periodic_enqueue(periodic.task, tick, job, now):
                    self.runtime.changes.publish("jobs", job.queue)
            except Exception:
                # One task's trouble must not starve the others (nor rescue, next round).
                log.exception("could not enqueue periodic task %s", periodic.task)


class Rescuer(_Background):
    """Takes back expired leases for a consume-only service, on a timer, busy or idle.

    A consumer has no Worker whose maintenance would do it, and rescuing only
    when a claim finds nothing would leave a dead consumer's job (and its
    group) behind every other queued job. Every consumer runs one; rescue is a
    compare-and-set, so several at once are safe.
    """

    def __init__(
        self, runtime: Runtime, lease: float, rescued: Callable[[], None], holder: str = "consumer"
    ) -> None:
        self._store = runtime.store
        self.interval = round_interval(lease)  # as often as maintenance
        self._rescued = rescued
        ttl = timedelta(seconds=max(self.interval * 3, 1.0))
        # With the jobs' own rules (retain=): no worker's maintenance applies them here.
        self._housekeeping = Housekeeping(runtime.store, runtime.retention, holder, ttl, own=True)
        super().__init__("conveyor-rescue")

    def stop(self) -> None:
        super().stop()
        self._housekeeping.release()

    def _run(self) -> None:
        backoff = DutyBackoff("consume: rescuing expired leases", log, ceiling=self.interval * 8)
        while not self._stop.is_set():
            try:
                rescued = self._store.job_rescue_expired()
                backoff.succeeded()
                pause = self.interval
            except Exception as exc:
                pause = backoff.failed(exc)
                rescued = []
            if rescued:
                log_rescued(log, self._store, rescued, "worker or consumer")
                self._rescued()
            try:
                self._housekeeping.run()
            except Exception as exc:  # on its own: a failed round never stops the rescues
                log.warning("consume: retention failed: %s", exc)
            self._stop.wait(pause)


def fold_and_prune(store: TaskMetricsStore, now: datetime) -> None:
    """Fold the events written since the last fold (a few batches at most), then drop
    the per-task rows no longer kept."""
    for _ in range(METRICS_FOLDS):
        if store.task_metrics_fold() < FOLD_LIMIT:
            break
    store.task_metrics_prune(now)
