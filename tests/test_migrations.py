"""Replaying the numbered migrations on an empty database gives the current schema.

The current schema of each backend is kept in ``tests/schema/<backend>.txt``,
a normalised dump. A new migration changes the dump; regenerate it with
``CONVEYOR_UPDATE_SCHEMA=1 pytest tests/test_migrations.py`` and review the diff.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.sql import load_migrations

SCHEMA_DIR = Path(__file__).parent / "schema"


def sqlite_schema(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, sql FROM sqlite_master "
            "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
    finally:
        conn.close()
    return "\n\n".join(f"-- {kind} {name}\n{sql};" for kind, name, sql in rows) + "\n"


def postgres_schema(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, "
            "coalesce(column_default, ''), coalesce(is_identity, 'NO') "
            "FROM information_schema.columns WHERE table_schema = 'public' "
            "ORDER BY table_name, ordinal_position"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "ORDER BY indexname"
        ).fetchall()
        constraints = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
            "FROM pg_constraint WHERE connamespace = 'public'::regnamespace "
            "ORDER BY 1, 2"
        ).fetchall()
    lines = ["-- columns"]
    lines += [" | ".join(map(str, row)) for row in columns]
    lines += ["", "-- indexes"] + [f"{name}: {definition}" for name, definition in indexes]
    lines += ["", "-- constraints"] + [" | ".join(row) for row in constraints]
    return "\n".join(lines) + "\n"


def check_snapshot(backend: str, actual: str) -> None:
    snapshot = SCHEMA_DIR / f"{backend}.txt"
    if os.environ.get("CONVEYOR_UPDATE_SCHEMA"):
        SCHEMA_DIR.mkdir(exist_ok=True)
        snapshot.write_text(actual)
    assert snapshot.exists(), f"no schema snapshot {snapshot}; run with CONVEYOR_UPDATE_SCHEMA=1"
    assert actual == snapshot.read_text(), (
        f"replaying the {backend} migrations no longer gives {snapshot}; "
        "if the change is intended, regenerate it with CONVEYOR_UPDATE_SCHEMA=1"
    )


def test_sqlite_migrations_give_the_current_schema(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'm.db'}")
    store.close()
    schema = sqlite_schema(tmp_path / "m.db")
    # Spark's tables are the Spark layer's, made by its first write (test_spark_storage.py).
    assert "spark" not in schema
    check_snapshot("sqlite", schema)


def test_postgres_migrations_give_the_current_schema(pg_clean_dsn: str) -> None:
    store = open_store(pg_clean_dsn)
    store.migrate()
    store.close()
    schema = postgres_schema(pg_clean_dsn)
    assert "spark" not in schema
    check_snapshot("postgres", schema)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migration_files_are_numbered_without_gaps(backend: str) -> None:
    migrations = load_migrations(f"conveyor.store.{backend}")
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))


@pytest.mark.sql_only  # SQL migration files; Redis keeps a layout version (store contract)
def test_migrate_is_idempotent_and_reports_the_version(store: Store) -> None:
    backend = "sqlite" if "SQLite" in store.description else "postgres"
    latest = len(load_migrations(f"conveyor.store.{backend}"))
    assert store.migrate() == latest
    assert store.migrate() == latest
    assert store.schema_version() == latest


def test_concurrent_first_use_migrates_once(tmp_path: Path) -> None:
    """Two processes opening a new SQLite file at once: one migrates, the other waits."""
    import subprocess
    import sys

    path = tmp_path / "race.db"
    code = (
        "import sys; from conveyor.store.sqlite import SQLiteStore; "
        "s = SQLiteStore(sys.argv[1]); print(s.schema_version()); s.close()"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE)
        for _ in range(4)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    finally:
        for p in procs:  # none left running, nor its pipe open, if one hung
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert all(p.returncode == 0 for p in procs)
    latest = str(len(load_migrations("conveyor.store.sqlite")))
    assert outputs == [latest] * 4
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone()[0] == int(latest)
    conn.close()


def test_sqlite_upgrade_keeps_every_job_event_and_rule(tmp_path: Path) -> None:
    """A database made by older migrations keeps its rows when the newer ones rebuild tables."""
    from datetime import UTC, datetime

    from conveyor.job import NewJob

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at REAL NOT NULL)"
    )
    old = [m for m in load_migrations("conveyor.store.sqlite") if m.version <= 4]
    for migration in old:
        conn.executescript(migration.sql)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name)
        )
    conn.execute(
        "INSERT INTO jobs (id, queue, task, state, run_at, key, created_at, finished_at) "
        "VALUES (7, 'q', 't', 'succeeded', 1, 'k', 1, 2), (8, 'q', 't', 'queued', 1, 'k', 1, NULL)"
    )
    conn.execute("UPDATE counters SET value = 8 WHERE name = 'jobs'")
    conn.execute(
        "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
        "VALUES (8, 'q', 't', 'enqueued', 0, 1)"
    )
    conn.commit()
    conn.close()

    store = open_store(f"sqlite:///{path}")
    try:
        assert store.schema_version() == len(load_migrations("conveyor.store.sqlite"))
        assert [(j.id, j.state.value, j.key) for j in store.job_get_many([7, 8])] == [
            (7, "succeeded", "k"),
            (8, "queued", "k"),
        ]
        assert [e.kind for e in store.event_list(8)] == ["enqueued"]
        # The live-key rule still holds after the rebuild: the same key returns job 8.
        now = datetime.now(UTC)
        again = store.job_insert_many([NewJob("q", "t", "[]", "{}", key="k", run_at=now)], now)
        assert again[0].id == 8
        # And ids go on from the counter, never reusing one.
        fresh = store.job_insert_many([NewJob("q", "t", "[]", "{}", run_at=now)], now)
        assert fresh[0].id == 9
        with pytest.raises(sqlite3.IntegrityError):
            sqlite3.connect(path).execute("UPDATE jobs SET state = 'lost' WHERE id = 9")
    finally:
        store.close()
