"""One place where an App hears of changes: its own process, and the database's feed.

Workers and waiters of an App share a single store subscription (one LISTEN
connection on PostgreSQL, one data_version watcher on SQLite), started when
the first listener arrives and closed with the App.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from conveyor.errors import ConfigurationError, JobCancelled, JobFailed
from conveyor.job import Job, JobState
from conveyor.store.protocols import ChangeCallback, JobStore, Subscription

log = logging.getLogger("conveyor.changes")


class ChangeHub:
    """The App's change feed: ``add(callback)`` hears ``callback(channel, payload)``.

    With ``listen`` False (an App made with ``notifications=False``) the store
    is never subscribed to: only this process's own changes are heard, and
    workers and consumers find the others' work by their poll.
    """

    def __init__(self, store: JobStore, listen: bool = True) -> None:
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


#: The environment variable that turns the store's notifications off (``0``) or on (``1``).
NOTIFICATIONS_ENV = "CONVEYOR_NOTIFICATIONS"
_NOTIFICATION_WORDS = {
    "1": True, "true": True, "yes": True, "on": True,
    "0": False, "false": False, "no": False, "off": False,
}  # fmt: skip


def notifications_setting(given: bool | None) -> bool:
    """Whether to listen: as given, else as ``$CONVEYOR_NOTIFICATIONS`` says, else yes."""
    if given is not None:
        if not isinstance(given, bool):
            raise ConfigurationError(f"notifications must be True or False, got {given!r}")
        return given
    raw = os.environ.get(NOTIFICATIONS_ENV)
    if raw is None or not raw.strip():
        return True
    try:
        return _NOTIFICATION_WORDS[raw.strip().lower()]
    except KeyError:
        raise ConfigurationError(
            f"${NOTIFICATIONS_ENV} must be 0 (poll only) or 1 (listen), got {raw!r}"
        ) from None


#: Longest a wait goes without reading the job again, should a signal be missed.
WAIT_FALLBACK_POLL = 0.5


def wait_for_job(
    changes: ChangeHub,
    job_id: int,
    read: Callable[[], Job],
    timeout: float | None,
    on_progress: Callable[[float | None, str | None], None] | None = None,
) -> Any:
    """Block until the job ``read()`` returns is terminal; its result (``app.wait``).

    Listens before it reads the job, so a completion between the two is never
    missed; reads again at least every WAIT_FALLBACK_POLL seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    changed = threading.Event()
    wanted = str(job_id)

    def listener(channel: str, payload: str) -> None:
        if channel == "progress":
            if on_progress is not None:
                job, fraction, message = payload.split("\t", 2)
                if job == wanted:
                    on_progress(float(fraction) if fraction else None, message or None)
            return
        if channel in ("done", "any", "reconnected") and (
            not payload or wanted in payload.split(",")
        ):
            changed.set()

    changes.add(listener)
    try:
        while True:
            changed.clear()
            job = read()
            if job.state == JobState.SUCCEEDED:
                return job.result
            if job.state == JobState.FAILED:
                raise JobFailed(job.id, job.error)
            if job.state == JobState.CANCELLED:
                raise JobCancelled(job.id)
            pause = WAIT_FALLBACK_POLL
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} is still {job.state} after {timeout}s")
                pause = min(pause, left)
            changed.wait(pause)
    finally:
        changes.remove(listener)
