"""Fixtures that give each test a fresh store (or App) on every backend.

A test that takes ``store``, ``dsn`` or ``app`` runs once on SQLite, once on
PostgreSQL and once on Redis: one contract, checked on every store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conveyor import App
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store

BACKENDS = ["sqlite", "postgres", "redis"]
#: The backends with SQL. A test about SQL itself (its text, triggers, migrations,
#: files, the Spark data source) is marked ``sql_only`` (a test, or a whole module
#: with ``pytestmark``): its ``dsn`` runs on these only, and it says why.
SQL_BACKENDS = ["sqlite", "postgres"]
sql_only = pytest.mark.sql_only


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that uses ``dsn`` runs on each backend (the SQL ones, when ``sql_only``)."""
    if "dsn" in metafunc.fixturenames and not _parametrized_by_hand(metafunc, "dsn"):
        sql = metafunc.definition.get_closest_marker("sql_only") is not None
        metafunc.parametrize("dsn", SQL_BACKENDS if sql else BACKENDS, indirect=True)


def _parametrized_by_hand(metafunc: pytest.Metafunc, name: str) -> bool:
    """A test that gives ``dsn`` values of its own (malformed DSNs, say) keeps them."""
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0]
        listed = names.replace(" ", "").split(",") if isinstance(names, str) else list(names)
        if name in listed:
            return True
    return False


@pytest.fixture
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A DSN of a fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    if request.param == "redis":
        redis_dsn: str = request.getfixturevalue("redis_clean_dsn")
        return redis_dsn
    pg_dsn: str = request.getfixturevalue("pg_clean_dsn")
    return pg_dsn


@pytest.fixture
def store(dsn: str) -> Iterator[Store]:
    """A migrated store on a fresh database."""
    opened = open_store(dsn)
    opened.migrate()
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """A migrated store on a fresh SQLite file and its DSN, for checks one backend suffices for."""
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    opened = open_store(dsn)
    opened.migrate()
    yield dsn, opened
    opened.close()


@pytest.fixture
def app(dsn: str) -> Iterator[App]:
    """A migrated App on a fresh database."""
    with App(dsn) as application:
        application.migrate()
        yield application


@contextmanager
def event_committed_late(pg_dsn: str) -> Iterator[tuple[Callable[[], None], int, int]]:
    """Two events on PostgreSQL whose seqs commit out of order.

    Yields ``(commit_early, early_seq, late_seq)``: the event with the higher
    seq is committed, the one with the lower seq waits in an open transaction
    until ``commit_early()``.
    """
    import psycopg

    insert = (
        "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
        "VALUES (%s, 'q', 't', 'enqueued', 0, now()) RETURNING seq"
    )
    with psycopg.connect(pg_dsn) as early, psycopg.connect(pg_dsn) as late:
        early_seq = early.execute(insert, (1,)).fetchone()[0]  # type: ignore[index]
        late_seq = late.execute(insert, (2,)).fetchone()[0]  # type: ignore[index]
        late.commit()
        assert early_seq < late_seq
        yield early.commit, early_seq, late_seq
