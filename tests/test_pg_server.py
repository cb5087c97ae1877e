"""The PostgreSQL test harness itself: fixtures and PgServer.restart()."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from pg_server import PgServer

#: Starts real PostgreSQL clusters: left out of the fast inner loop.
pytestmark = pytest.mark.slow


def test_pg_dsn_reaches_postgresql(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("select version()").fetchone()
    assert row is not None
    version = row[0]
    if os.environ.get("CONVEYOR_TEST_PG_DSN"):
        assert "PostgreSQL" in version
    else:
        assert "PostgreSQL 15" in version


def test_pg_clean_dsn_is_a_fresh_empty_database(pg_dsn: str, pg_clean_dsn: str) -> None:
    assert pg_clean_dsn != pg_dsn
    with psycopg.connect(pg_clean_dsn) as conn:
        tables = conn.execute(
            "select count(*) from information_schema.tables where table_schema = 'public'"
        ).fetchone()
        assert tables == (0,)
        conn.execute("create table marker (id int primary key)")
        conn.execute("insert into marker values (1)")


def test_pg_clean_dsn_databases_are_dropped(pg_dsn: str, pg_clean_dsn: str) -> None:
    # The previous test's database (and its "marker" table) must be gone; only ours exists.
    with psycopg.connect(pg_clean_dsn) as conn:
        tables = conn.execute(
            "select count(*) from information_schema.tables where table_name = 'marker'"
        ).fetchone()
        assert tables == (0,)
        row = conn.execute("select current_database()").fetchone()
        assert row is not None
        current = row[0]
    with psycopg.connect(pg_dsn) as conn:
        leftovers = conn.execute(
            "select datname from pg_database where datname like %s and datname <> %s",
            (f"t\\_{os.getpid()}\\_%", current),
        ).fetchall()
    assert leftovers == []


def test_sqlite_path_is_fresh(sqlite_path: Path) -> None:
    assert not sqlite_path.exists()
    assert sqlite_path.parent.is_dir()


def test_restart_keeps_data_on_same_port() -> None:
    server = PgServer()
    server.start()
    try:
        dsn = server.dsn
        port = server.port
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("create table kept (id int primary key, note text)")
            conn.execute("insert into kept values (1, 'survives restart')")

        with psycopg.connect(dsn, autocommit=True) as before:
            server.restart()
            assert server.port == port
            assert server.dsn == dsn
            # A connection opened before the restart is dead afterwards.
            with pytest.raises(psycopg.OperationalError):
                before.execute("select 1")

        with psycopg.connect(dsn) as conn:
            rows = conn.execute("select id, note from kept").fetchall()
        assert rows == [(1, "survives restart")]
    finally:
        server.stop()
    assert server.base_dir is None
    assert not server.running


def test_stop_removes_cluster_and_refuses_connections() -> None:
    with PgServer() as server:
        dsn = server.dsn
        base_dir = server.base_dir
        assert base_dir is not None and base_dir.is_dir()
        assert server.major_version.isdigit()
    assert not base_dir.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    server.stop()  # idempotent
