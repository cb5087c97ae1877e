"""Shared fixtures.

- ``pg_dsn`` (session): DSN of a PostgreSQL database. Uses ``CONVEYOR_TEST_PG_DSN``
  when set, otherwise starts a throwaway PostgreSQL cluster for the session.
  If PostgreSQL cannot be started the tests that need it fail; they are never
  skipped.
- ``pg_clean_dsn`` (function): DSN of a brand-new empty database, dropped after
  the test.
- ``redis_dsn`` (session): DSN of a Redis server. Uses ``CONVEYOR_TEST_REDIS_DSN``
  when set, otherwise starts a throwaway ``redis-server`` for the session.
- ``redis_clean_dsn`` (function): the same server, emptied (FLUSHALL) before the test.
- ``sqlite_path`` (function): path of a not-yet-existing SQLite file in a fresh
  temporary directory.

``CONVEYOR_TEST_FAST=1`` (``make test-fast``) runs the quick inner loop: only
what needs neither PostgreSQL, nor Redis, nor Spark, nor a browser, nor a subprocess
fleet (tests marked ``slow``). The rest is deselected, not skipped: CI runs all.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pg_server import PgServer, PgServerError
from redis_server import RedisServer, RedisServerError

pytest_plugins = ["store_fixtures", "spark_fixtures"]

# pytest-xdist's workers run with COLUMNS=80 in their environment; the command
# line's tables would then fold as on a terminal. The tests see what a pipe sees.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

_db_counter = itertools.count(1)


def dsn_with_dbname(dsn: str, dbname: str) -> str:
    """Return ``dsn`` pointing at database ``dbname``, keeping its form (URL or key=value)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + dbname))
    return make_conninfo(dsn, dbname=dbname)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    external = os.environ.get("CONVEYOR_TEST_PG_DSN")
    if external:
        yield external
        return
    server = PgServer()
    try:
        server.start()
    except PgServerError as exc:
        pytest.fail(f"could not start PostgreSQL for the tests: {exc}", pytrace=False)
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def pg_clean_dsn(pg_dsn: str) -> Iterator[str]:
    name = f"t_{os.getpid()}_{next(_db_counter)}"
    ident = sql.Identifier(name)
    with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=30) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(ident))
    try:
        yield dsn_with_dbname(pg_dsn, name)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=30) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@pytest.fixture(scope="session")
def redis_dsn() -> Iterator[str]:
    external = os.environ.get("CONVEYOR_TEST_REDIS_DSN")
    if external:
        yield external
        return
    try:
        server = RedisServer()
        server.start()
    except RedisServerError as exc:
        pytest.fail(f"could not start Redis for the tests: {exc}", pytrace=False)
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def redis_clean_dsn(redis_dsn: str) -> str:
    import redis

    client = redis.Redis.from_url(redis_dsn)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_dsn


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "conveyor.db"


#: What a test needs that the fast inner loop does without.
_HEAVY_FIXTURES = frozenset(
    {"pg_dsn", "pg_clean_dsn", "redis_dsn", "redis_clean_dsn", "spark", "browser"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("CONVEYOR_TEST_FAST") != "1":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("dsn") if callspec is not None else None
        heavy = bool(fixtures & _HEAVY_FIXTURES) or backend not in (None, "sqlite")
        heavy = heavy or item.get_closest_marker("redis") is not None
        if heavy or item.get_closest_marker("slow") is not None:
            drop.append(item)
        else:
            keep.append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
