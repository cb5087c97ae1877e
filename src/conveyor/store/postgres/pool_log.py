"""One warning per outage from psycopg's pool, not one per reconnection attempt.

While PostgreSQL is down, ``psycopg.pool`` warns on every failed attempt to
(re)connect, with a backoff of its own, and on every broken connection it
discards: about forty warnings in a 35-second outage, which bury the one line
that matters. The filter lets the first warning of a kind through, holds back
the same kind for a minute, and then says how many it held back with the
next one. Other levels and other loggers pass untouched.
"""

from __future__ import annotations

import logging
import threading
import time

POOL_LOGGER = "psycopg.pool"
#: Seconds during which more warnings of the same kind are only counted.
QUIET = 60.0


class OnePerOutage(logging.Filter):
    """Passes a kind of warning (its format string) once per QUIET seconds, counting the rest."""

    def __init__(self, quiet: float = QUIET) -> None:
        super().__init__()
        self.quiet = quiet
        self._lock = threading.Lock()
        #: kind -> (when one last passed, monotonic; how many were held back since)
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        kind = str(record.msg)
        now = time.monotonic()
        with self._lock:
            passed, held = self._seen.get(kind, (-self.quiet, 0))
            if now - passed < self.quiet:
                self._seen[kind] = (passed, held + 1)
                return False
            self._seen[kind] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last minute not shown)"
        return True


def quiet_pool_warnings() -> None:
    """Put the filter on psycopg's pool logger, once however many stores are opened."""
    logger = logging.getLogger(POOL_LOGGER)
    if not any(isinstance(f, OnePerOutage) for f in logger.filters):
        logger.addFilter(OnePerOutage())
