"""One place where an App hears of changes: its own process, and the database's feed.

Workers and waiters of an App share a single store subscription (one LISTEN
connection on PostgreSQL, one data_version watcher on SQLite), started when
the first listener arrives and closed with the App.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor.job import Job
from conveyor.store.protocols import ChangeCallback, Store, Subscription

log = logging.getLogger("conveyor.changes")


class ChangeHub:
    """The App's change feed: ``add(callback)`` hears ``callback(channel, payload)``.

    With ``listen`` False (an App made with ``notifications=False``) the store
    is never subscribed to: only this process's own changes are heard, and
    workers and consumers find the others' work by their poll.
    """

    def __init__(self, store: Store, listen: bool = True) -> None:
        self._store = store
        self.listen = listen
        self._listeners: list[ChangeCallback] = []
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None

    def add(self, listener: ChangeCallback) -> None:
        with self._lock:
            self._listeners.append(listener)
            if self._subscription is None and self.listen:
                self._subscription = self._store.subscribe(self.publish)

    def remove(self, listener: ChangeCallback) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def publish(self, channel: str, payload: str = "") -> None:
        """Tell every listener (called for local events and from the store's feed)."""
        for listener in list(self._listeners):
            try:
                listener(channel, payload)
            except Exception:
                log.exception("a change listener failed on %s %s", channel, payload)

    def close(self) -> None:
        with self._lock:
            subscription, self._subscription = self._subscription, None
            self._listeners.clear()
        if subscription is not None:
            subscription.close()


#: What ``app.on_change`` tells: the kinds of change, and what each carries.
CHANGE_KINDS = ("jobs", "claimed", "held", "done", "cancel", "progress", "any", "reconnected")


@dataclass(frozen=True, slots=True)
class Change:
    """Something changed in the store (``app.on_change``).

    ``kind``: "jobs" (``queue`` has new ready work: an enqueue, a retry, a job
    let go), "claimed" (``job_ids`` were claimed: by a worker, a consumer or
    inline mode, in this process only), "held" (``job_ids`` were held, in this
    process only), "done" (``job_ids`` ended: succeeded, failed, cancelled, or
    retried, snoozed, released), "cancel" (the cancel of running ``job_ids``
    was requested), "progress" (``job_ids`` reported progress, in this process
    only), "any" (something changed that the store cannot name: SQLite's file
    watch), "reconnected" (the feed listens from now on: it says so when it
    starts, and after an outage, when changes may have been missed; look at
    everything again).
    """

    kind: str
    queue: str | None = None
    job_ids: tuple[int, ...] = ()


def ids_payload(jobs: Sequence[Job]) -> str:
    """The payload of a change that names jobs: their ids, comma-separated."""
    return ",".join(str(job.id) for job in jobs)


def change_of(channel: str, payload: str) -> Change | None:
    """The public form of one message of the hub (None: not one of CHANGE_KINDS)."""
    if channel not in CHANGE_KINDS:
        return None
    if channel == "jobs":
        return Change("jobs", queue=payload or None)
    if channel in ("claimed", "held", "done", "cancel", "progress"):
        first = payload.partition("\t")[0] if channel == "progress" else payload
        if channel == "cancel":
            first = first.partition(":")[0]  # the lease token stays inside
        ids = tuple(int(i) for i in first.split(",") if i.strip().isdigit())
        return Change(channel, job_ids=ids)
    return Change(channel)


class ChangeListener:
    """What ``app.on_change`` returns: ``close()`` stops the calls."""

    def __init__(self, hub: ChangeHub, callback: Callable[[Change], None]) -> None:
        self._hub = hub
        self._callback = callback
        hub.add(self._hear)

    def _hear(self, channel: str, payload: str) -> None:
        change = change_of(channel, payload)
        if change is not None:
            self._callback(change)

    def close(self) -> None:
        self._hub.remove(self._hear)

    def __enter__(self) -> ChangeListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
