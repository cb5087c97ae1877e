"""The dashboard while its store cannot be reached: what counts as such, and when to try again.

A page that finds the store away answers 503 in the page frame, naming the
store and saying that it retries; the pages asked for meanwhile answer the same
at once, without waiting for a connection timeout each, until the retry is due.
Then one request tries the store again (the others keep answering 503 until it
knows), and the first that gets through ends the outage.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from conveyor.errors import StoreUnavailableError
from conveyor.job import utcnow

#: Seconds between two tries of a store that could not be reached: short, so that
#: the pages are back soon after the store (the others answer 503 at once meanwhile).
#: A /healthz that reaches the store ends the outage at once.
RETRY_SECONDS = 2.0
#: What a SQLite error says when the file is away or held by another process.
_SQLITE_AWAY = ("locked", "busy", "unable to open", "disk i/o")
#: Driver errors of a server that went away (the stores wrap most of them already).
_DRIVER_AWAY = {"OperationalError", "PoolTimeout", "ConnectionError", "TimeoutError"}


def unreachable(exc: BaseException) -> bool:
    """Whether an error says the store cannot be reached now (not that a request was wrong)."""
    if isinstance(exc, StoreUnavailableError):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(words in text for words in _SQLITE_AWAY)
    package = type(exc).__module__.split(".")[0]
    names = {cls.__name__ for cls in type(exc).__mro__}
    return package in ("psycopg", "psycopg_pool", "redis") and bool(names & _DRIVER_AWAY)


def reason_of(exc: BaseException) -> str:
    """The first line of what the store said."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


@dataclass(frozen=True)
class Outage:
    """The store could not be reached: why, since when, and when it is tried again."""

    reason: str
    since: datetime
    #: time.monotonic() of the next try.
    retry_at: float


class StoreWatch:
    """Whether the store answered last time; shared by every request of one dashboard."""

    def __init__(self, retry: float | None = None) -> None:
        self.retry = RETRY_SECONDS if retry is None else retry
        self._lock = threading.Lock()
        self._outage: Outage | None = None
        self._trying = False

    @property
    def outage(self) -> Outage | None:
        return self._outage

    def wait(self) -> Outage | None:
        """The outage to answer with now; None to go to the store.

        None while nothing is known wrong, and, during an outage, for the one
        request that tries again once the retry is due (``settle`` ends its try).
        """
        with self._lock:
            outage = self._outage
            if outage is None:
                return None
            if self._trying or time.monotonic() < outage.retry_at:
                return outage
            self._trying = True
            return None

    def failed(self, exc: BaseException) -> Outage:
        """The store could not be reached: start (or go on with) the outage."""
        with self._lock:
            self._trying = False
            since = self._outage.since if self._outage is not None else utcnow()
            self._outage = Outage(reason_of(exc), since, time.monotonic() + self.retry)
            return self._outage

    def answered(self) -> None:
        """The store answered: the outage, if any, is over."""
        with self._lock:
            self._trying = False
            self._outage = None

    def settle(self) -> None:
        """A try ended without a verdict (the request failed before reaching the store)."""
        with self._lock:
            self._trying = False
