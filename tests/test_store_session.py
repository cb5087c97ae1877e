"""A SQL store's public session: what a layer on top of it (Spark's storage) uses."""

from __future__ import annotations

import pytest

from conveyor.store.protocols import Store
from conveyor.store.sql import Migration

pytestmark = pytest.mark.sql_only

_VERSION = "SELECT coalesce(max(version), 0) FROM layer_migrations"
_RECORD = {
    "sqlite": "INSERT INTO layer_migrations (version, name, applied_at) "
    "VALUES (:version, :name, :now)",
    "postgres": "INSERT INTO layer_migrations (version, name, applied_at) "
    "VALUES (%(version)s, %(name)s, %(now)s)",
}
_TABLE = {
    "sqlite": "CREATE TABLE IF NOT EXISTS layer_migrations "
    "(version int, name text, applied_at real)",
    "postgres": "CREATE TABLE IF NOT EXISTS layer_migrations "
    "(version int, name text, applied_at timestamptz)",
}


def test_a_layer_runs_its_own_migrations_and_transactions_through_the_session(
    store: Store, dsn: str
) -> None:
    session = store.session()  # type: ignore[attr-defined]
    backend = "sqlite" if dsn.startswith("sqlite") else "postgres"
    assert session.description == store.description  # type: ignore[attr-defined]
    line = [Migration(1, "things", "CREATE TABLE layer_things (n int);")]

    def migrate() -> int:
        opened = session.write() if backend == "sqlite" else session.transaction()
        with opened as conn:
            conn.execute(_TABLE[backend])
            version: int = session.apply_migrations(conn, line, _VERSION, _RECORD[backend])
            return version

    assert migrate() == 1
    assert migrate() == 1  # applied once
    with pytest.raises(RuntimeError):
        opened = session.write() if backend == "sqlite" else session.transaction()
        with opened as conn:
            conn.execute("INSERT INTO layer_things VALUES (1)")
            raise RuntimeError("rolled back")
    if backend == "sqlite":
        count = session.connection().execute("SELECT count(*) FROM layer_things").fetchone()[0]
    else:
        with session.connection() as conn:
            count = conn.execute("SELECT count(*) FROM layer_things").fetchone()[0]
        own = session.connect()
        try:
            assert own.execute("SHOW timezone").fetchone()[0] == "UTC"
        finally:
            own.close()
    assert count == 0
