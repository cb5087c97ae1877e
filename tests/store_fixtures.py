"""Fixtures that give each test a fresh store (or App) on every backend.

A test that takes ``store``, ``dsn`` or ``app`` runs once on SQLite and once on
PostgreSQL: one contract, checked on both databases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor import App
from conveyor.store.base import Store
from conveyor.store.dsn import open_store

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A DSN of a fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
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
def app(dsn: str) -> Iterator[App]:
    """A migrated App on a fresh database."""
    with App(dsn) as application:
        application.migrate()
        yield application
