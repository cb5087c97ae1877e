"""LISTEN/NOTIFY: PostgreSQL tells waiting workers about new jobs, cancels and completions.

The store sends ``conveyor_jobs`` (payload: queue) when a job becomes ready,
``conveyor_cancel`` (payload: job id) when a running job's cancel is
requested, and ``conveyor_done`` (payload: job id) when a job ends. One
listener thread per App holds a dedicated connection. Notifications sent while
it is disconnected are lost, so after every reconnect it reports
"reconnected": workers then look at everything again (claim, check cancels)
instead of trusting that nothing happened.
"""

from __future__ import annotations

import logging
import threading

import psycopg
from psycopg import sql

from conveyor.pacing import DutyBackoff
from conveyor.store.protocols import ChangeCallback

log = logging.getLogger("conveyor.postgres")

CHANNELS = {"conveyor_jobs": "jobs", "conveyor_cancel": "cancel", "conveyor_done": "done"}
#: How long one wait for notifications lasts before checking whether to stop.
_WAIT = 0.5
_MAX_BACKOFF = 5.0


class Listener:
    def __init__(self, dsn: str, on_change: ChangeCallback, connect_timeout: float = 10.0) -> None:
        self._dsn = dsn
        self._on_change = on_change
        self._connect_timeout = connect_timeout
        self._stop = threading.Event()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-pg-listen", daemon=True)
        self._thread.start()

    def _connect(self) -> psycopg.Connection[tuple[object, ...]]:
        conn = psycopg.connect(
            self._dsn, autocommit=True, connect_timeout=max(1, int(self._connect_timeout))
        )
        for channel in CHANNELS:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return conn

    def _run(self) -> None:
        backoff = DutyBackoff("LISTEN connection", log, first=0.1, ceiling=_MAX_BACKOFF)
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
            except psycopg.Error as exc:
                self._stop.wait(backoff.failed(exc))
                continue
            self.connected.set()
            # Whatever was notified before LISTEN took effect (the first time:
            # while this thread was starting) is lost: everyone looks again.
            self._on_change("reconnected", "")
            try:
                while not self._stop.is_set():
                    for notify in self._conn.notifies(timeout=_WAIT):
                        self._on_change(CHANNELS.get(notify.channel, "any"), notify.payload)
                    # Reset only once a connection has lasted: a server that accepts
                    # and then drops every connection is still met with growing pauses.
                    backoff.succeeded()
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    self._stop.wait(backoff.failed(exc))
            finally:
                self.connected.clear()
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
