"""The Redis server a benchmark runs on: the one given, else a throwaway server."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def redis_database(dsn: str | None) -> Iterator[str]:
    """Yield ``dsn`` when given; otherwise start the tests' throwaway server and stop it after.

    The throwaway server runs as the tests run it: append-only file on with
    ``appendfsync everysec``, no RDB snapshots.
    """
    if dsn:
        yield dsn
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from redis_server import RedisServer

    server = RedisServer()
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()
