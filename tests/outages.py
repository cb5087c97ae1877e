"""Real outages of each store, for tests that take the database away mid-run.

``private_store(kind)`` gives a DSN on a database of the test's own (a SQLite
file, a PostgreSQL server, a redis-server) and a context manager that makes it
unavailable inside its block and available again after it:

- SQLite: another process holds the file's exclusive lock (``BEGIN
  EXCLUSIVE``): every read and write of the store waits, then fails;
- PostgreSQL: the server is shut down (fast) and started again on the same
  port and data directory;
- Redis: redis-server is stopped and started again on the same port and
  append-only file.

The stores are opened with short timeouts (``STORE_OPTIONS``) so that an
outage is met within a second, as it would be by a production worker whose
database went away.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from conveyor import App
from conveyor.errors import StoreUnavailableError
from pg_server import PgServer
from redis_server import RedisServer

#: Per kind, the store options that make an outage show within about a second.
STORE_OPTIONS: dict[str, dict[str, Any]] = {
    "sqlite": {"busy_timeout": 0.5},
    "postgres": {"connect_timeout": 1},
    "redis": {"connect_timeout": 1, "socket_timeout": 2},
}

_LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


@contextmanager
def _sqlite_locked(path: Path) -> Iterator[None]:
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None
        line = locker.stdout.readline()
        assert line.strip() == "locked", f"the locking process said {line!r}"
        yield
    finally:
        assert locker.stdin is not None and locker.stdout is not None
        locker.stdin.close()
        locker.wait(timeout=10)
        locker.stdout.close()


@contextmanager
def _pg_down(server: PgServer) -> Iterator[None]:
    server._shutdown()
    try:
        yield
    finally:
        server._pg_ctl_start()


@contextmanager
def _redis_down(server: RedisServer) -> Iterator[None]:
    server.shutdown()
    try:
        yield
    finally:
        server.start()


Away = Callable[[], AbstractContextManager[None]]


def answering(app: App, timeout: float = 30.0) -> None:
    """Wait until ``app``'s store answers again after an outage, as any caller would retry."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            app.stats()
            return
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def private_store(kind: str, tmp_path: Path) -> Iterator[tuple[str, Away]]:
    """A DSN on a database of this test's own, and how to take it away."""
    if kind == "sqlite":
        path = tmp_path / "outage.db"
        yield f"sqlite:///{path}", lambda: _sqlite_locked(path)
    elif kind == "postgres":
        pg = PgServer()
        pg.start()
        try:
            yield pg.dsn, lambda: _pg_down(pg)
        finally:
            pg.stop()
    elif kind == "redis":
        redis = RedisServer()
        redis.start()
        try:
            yield redis.dsn, lambda: _redis_down(redis)
        finally:
            redis.stop()
    else:
        raise ValueError(f"no such store kind: {kind}")
