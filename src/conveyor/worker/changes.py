"""One place where an App hears of changes: its own process, and the database's feed.

Workers and waiters of an App share a single store subscription (one LISTEN
connection on PostgreSQL, one data_version watcher on SQLite), started when
the first listener arrives and closed with the App.
"""

from __future__ import annotations

import logging
import threading

from conveyor.store.base import ChangeCallback, Store, Subscription

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
