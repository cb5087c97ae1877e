"""An outage of PostgreSQL gives one warning from psycopg's pool, not one per reconnection."""

from __future__ import annotations

import logging
import time

import pytest

from conveyor.errors import StoreUnavailableError
from conveyor.store.postgres.pool_log import POOL_LOGGER, OnePerOutage
from conveyor.store.postgres.store import PostgresStore


def test_a_pool_that_cannot_connect_warns_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fresh filter: an earlier test's outage must not have used up this one's warning.
    monkeypatch.setattr(logging.getLogger(POOL_LOGGER), "filters", [])
    caplog.set_level(logging.WARNING, logger=POOL_LOGGER)
    with pytest.raises(StoreUnavailableError):
        # Nothing listens on port 1: every attempt of the pool fails, with its backoff.
        PostgresStore("postgresql://nobody@127.0.0.1:1/jobs", connect_timeout=4)
    connecting = [r for r in caplog.records if r.name == POOL_LOGGER and "connecting" in r.msg]
    assert len(connecting) == 1, [r.getMessage() for r in connecting]


def test_held_back_warnings_are_counted_in_the_next_one_that_passes() -> None:
    quiet = OnePerOutage(quiet=0.2)

    def warning(text: str = "error connecting in %r: %s") -> logging.LogRecord:
        return logging.LogRecord(POOL_LOGGER, logging.WARNING, "", 0, text, ("pool", "x"), None)

    assert quiet.filter(warning())
    assert not quiet.filter(warning()) and not quiet.filter(warning())
    assert quiet.filter(warning("discarding broken connection: %s"))  # another kind
    info = logging.LogRecord(POOL_LOGGER, logging.INFO, "", 0, "error connecting", (), None)
    assert quiet.filter(info)
    time.sleep(0.25)
    later = warning()
    assert quiet.filter(later)
    assert later.getMessage().endswith("(2 more like it in the last minute not shown)")
