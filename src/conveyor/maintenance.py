"""Work that one worker at a time does for everyone: rescue, retention, periodic tasks.

Every worker runs a Maintenance thread; only the holder of the leader lease
acts. The lease is a row with an expiry, renewed each round, so a leader that
dies or freezes is replaced within one lease. Every action is safe to run
twice (rescue is a compare-and-set, periodic ticks carry unique keys), so a
brief overlap of two leaders costs nothing.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.job import utcnow
from conveyor.schedule import Schedule

if TYPE_CHECKING:
    from conveyor.app import App

log = logging.getLogger("conveyor.maintenance")

LEADER_NAME = "maintenance"


@dataclass(frozen=True)
class Periodic:
    task: str
    schedule: Schedule


class Maintenance:
    def __init__(self, app: App, holder: str, lease: float) -> None:
        self.app = app
        self.holder = holder
        # Check often enough that an expired lease is rescued within about a
        # quarter of its length, but never hammer the database.
        self.interval = min(max(lease / 4, 0.05), 5.0)
        self.ttl = timedelta(seconds=max(self.interval * 3, 1.0))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-maintenance", daemon=True)
        self._last_tick: dict[str, datetime] = {}
        self.is_leader = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self.is_leader:
            try:
                self.app.store.leader_release(LEADER_NAME, self.holder)
            except Exception:
                log.exception("could not release the maintenance lease")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once(utcnow())
            except Exception:
                # A database restart or a locked file: try again next round.
                log.exception("maintenance round failed")
            self._stop.wait(self.interval)

    def run_once(self, now: datetime) -> None:
        store = self.app.store
        self.is_leader = store.leader_acquire(LEADER_NAME, self.holder, self.ttl, now)
        if not self.is_leader:
            return
        rescued = store.job_rescue_expired(now)
        if rescued:
            log.warning("rescued %d job(s) whose worker was lost: %s", len(rescued), rescued[:10])
        self.app.apply_retention(now)
        store.worker_prune(now - timedelta(seconds=max(self.ttl.total_seconds() * 10, 60)))
        self._enqueue_periodic(now)

    def _enqueue_periodic(self, now: datetime) -> None:
        for periodic in self.app.periodic_tasks:
            tick = periodic.schedule.last_tick(now)
            if self._last_tick.get(periodic.task) == tick:
                continue
            # One key per tick, kept forever: however many workers (or leaders
            # in turn) get here, a tick is enqueued once.
            key = f"periodic:{periodic.task}:{tick.isoformat()}"
            try:
                self.app.enqueue(periodic.task, key=key, unique="forever", run_at=tick)
            except Exception:
                # One task's trouble must not starve the others (nor rescue, next round).
                log.exception("could not enqueue periodic task %s", periodic.task)
                continue
            self._last_tick[periodic.task] = tick
