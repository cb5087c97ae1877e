"""The PostgreSQL database a benchmark runs on: the one given, else a throwaway server."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    """Yield ``dsn`` when given; otherwise start the tests' throwaway server and stop it after."""
    if dsn:
        yield dsn
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from pg_server import PgServer

    server = PgServer()
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()
