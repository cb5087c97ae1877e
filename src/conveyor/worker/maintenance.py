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
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.job import NewJob, resolve_run_at, utcnow
from conveyor.pacing import DutyBackoff
from conveyor.store.protocols import FlowControlStore, OperatorStore
from conveyor.worker.talk import log_rescued

if TYPE_CHECKING:
    from conveyor.app import App

log = logging.getLogger("conveyor.maintenance")

LEADER_NAME = "maintenance"
#: Retention has a leader of its own: every process that consumes (a worker's
#: maintenance, a consumer's rescuer) runs for it, and one of them acts.
RETENTION_LEADER = "retention"


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
    def __init__(self, app: App, holder: str, lease: float) -> None:
        self.app = app
        self.holder = holder
        # Check often enough that an expired lease is rescued within about a
        # quarter of its length, but never hammer the database.
        self.interval = round_interval(lease)
        self.ttl = timedelta(seconds=max(self.interval * 3, 1.0))
        super().__init__("conveyor-maintenance")
        self.is_leader = False
        self._retention = Housekeeping(app, holder, self.ttl)

    def stop(self) -> None:
        super().stop()
        self._retention.release()
        if self.is_leader:
            try:
                self.app.store.leader_release(LEADER_NAME, self.holder)
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
        store = self.app.store
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
        if isinstance(store, OperatorStore) and self.app.has_retention:
            actions.append(("retention", lambda: self._retention.run(wall)))
        if isinstance(store, FlowControlStore):
            # Claims prune the starts of the queues they claim; this, the rest.
            actions.append(("limits", lambda: store.limit_prune(wall)))
        for name, action in actions:
            try:
                action()
            except Exception as exc:
                log.warning("maintenance: %s failed: %s", name, exc)

    def _forget_after(self) -> timedelta:
        return timedelta(seconds=max(self.ttl.total_seconds() * 10, 60))

    def _rescue(self, now: datetime | None) -> None:
        rescued = self.app.store.job_rescue_expired(now)
        log_rescued(log, self.app.store, rescued, "worker")

    def _enqueue_periodic(self, now: datetime) -> None:
        for periodic in self.app.periodic_tasks:
            tick = periodic.schedule.last_tick(now)
            task = self.app.tasks.get(periodic.task)
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
                if self.app.store.periodic_enqueue(periodic.task, tick, job, now):
                    self.app.changes.publish("jobs", job.queue)
            except Exception:
                # One task's trouble must not starve the others (nor rescue, next round).
                log.exception("could not enqueue periodic task %s", periodic.task)


class Housekeeping:
    """Retention (``App(retention=..., retention_by_state=..., keep_finished=...)``), led.

    Run by every worker's maintenance and every consumer's rescuer, so that a
    consume-only service prunes as a worker does; the holder of the retention
    lease acts, the others skip their turn. A deletion is safe to run twice.
    """

    def __init__(self, app: App, holder: str, ttl: timedelta) -> None:
        self.app = app
        self.holder = holder
        self.ttl = ttl
        self.is_leader = False

    def run(self, now: datetime | None = None) -> int:
        """One round of retention if this process leads it; the jobs deleted."""
        store = self.app.store
        if not isinstance(store, OperatorStore) or not self.app.has_retention:
            return 0
        wall = now or utcnow()
        self.is_leader = store.leader_acquire(RETENTION_LEADER, self.holder, self.ttl, wall)
        return self.app.apply_retention(wall) if self.is_leader else 0

    def release(self) -> None:
        if self.is_leader:
            try:
                self.app.store.leader_release(RETENTION_LEADER, self.holder)
            except Exception:
                log.exception("could not release the retention lease")
            self.is_leader = False


class Rescuer(_Background):
    """Takes back expired leases for a consume-only service, on a timer, busy or idle.

    A consumer has no Worker whose maintenance would do it, and rescuing only
    when a claim finds nothing would leave a dead consumer's job (and its
    group) behind every other queued job. Every consumer runs one; rescue is a
    compare-and-set, so several at once are safe.
    """

    def __init__(
        self, app: App, lease: float, rescued: Callable[[], None], holder: str = "consumer"
    ) -> None:
        self._app = app
        self.interval = round_interval(lease)  # as often as maintenance
        self._rescued = rescued
        ttl = timedelta(seconds=max(self.interval * 3, 1.0))
        self._housekeeping = Housekeeping(app, holder, ttl)
        super().__init__("conveyor-rescue")

    def stop(self) -> None:
        super().stop()
        self._housekeeping.release()

    def _run(self) -> None:
        backoff = DutyBackoff("consume: rescuing expired leases", log, ceiling=self.interval * 8)
        while not self._stop.is_set():
            try:
                rescued = self._app.store.job_rescue_expired()
                backoff.succeeded()
                pause = self.interval
            except Exception as exc:
                pause = backoff.failed(exc)
                rescued = []
            if rescued:
                log_rescued(log, self._app.store, rescued, "worker or consumer")
                self._rescued()
            try:
                self._housekeeping.run()
            except Exception as exc:  # on its own: a failed round never stops the rescues
                log.warning("consume: retention failed: %s", exc)
            self._stop.wait(pause)
