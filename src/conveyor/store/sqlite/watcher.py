"""Cross-process change detection for SQLite: ``PRAGMA data_version``.

SQLite has no notifications between processes. ``data_version`` changes
whenever another connection commits to the file, and reading it costs a few
microseconds without touching any table, so a thread can check it every few
milliseconds and wake the worker when anything was written: a new job, a
retry, a cancel. The worker then asks the store what is ready.

The same thread checkpoints the write-ahead log (PASSIVE: without the write
lock, so commits go on meanwhile) when something was written, at most every
``CHECKPOINT_INTERVAL``: left to the committing writer, the copy and its sync
hold up whichever commit crosses the threshold.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("conveyor.sqlite")

#: How often the watcher checks, in seconds: the cross-process wake latency.
DEFAULT_INTERVAL = 0.002
#: After this long without a change, it checks at ``QUIET_INTERVAL`` instead:
#: an idle worker should cost next to nothing, and work that arrives after a
#: quiet spell waits a few milliseconds more at most.
QUIET_AFTER = 1.0
QUIET_INTERVAL = 0.01
#: How often, at most, the watcher checkpoints the write-ahead log, in seconds.
CHECKPOINT_INTERVAL = 0.25


class DataVersionWatcher:
    def __init__(
        self,
        path: Path,
        on_change: Callable[[str, str], None],
        interval: float = DEFAULT_INTERVAL,
    ) -> None:
        self._path = path
        self._on_change = on_change
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-sqlite-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            # A commit made while this thread was starting went unseen: look again.
            self._on_change("any", "")
            written = True
            next_checkpoint = changed_at = time.monotonic()
            while not self._stop.is_set():
                # A plain sleep: Event.wait with a timeout costs several times more,
                # and this loop runs hundreds of times a second.
                quiet = time.monotonic() - changed_at > QUIET_AFTER
                time.sleep(max(self._interval, QUIET_INTERVAL) if quiet else self._interval)
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                except sqlite3.Error as exc:  # a locked or vanished file: keep trying
                    log.warning("cannot read data_version of %s: %s", self._path, exc)
                    self._stop.wait(0.1)
                    continue
                if version != last:
                    last = version
                    written = True
                    changed_at = time.monotonic()
                    self._on_change("any", "")
                if written and time.monotonic() >= next_checkpoint:
                    written = False
                    next_checkpoint = time.monotonic() + CHECKPOINT_INTERVAL
                    try:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    except sqlite3.Error as exc:  # e.g. a read-only file: commits do it
                        log.debug("cannot checkpoint %s: %s", self._path, exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
