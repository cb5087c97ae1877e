"""Spark's storage: its own tables, made by its own migrations, apart from the store's.

No Spark session here: the write's driver side runs in this process (as the
benchmarks' write phases do), and the tables are read with plain SQL.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from conveyor.errors import SchemaMissingError
from conveyor.spark import write_result
from conveyor.spark.options import Options
from conveyor.spark.rows import WritePlan
from conveyor.spark.storage import ScanFilter, ScanRange, open_storage, scan_query
from conveyor.spark.writer import ConveyorWriter
from conveyor.store.dsn import sqlite_path
from conveyor.store.protocols import Store
from conveyor.store.sql import load_migrations
from spark_helpers import all_jobs, spark_tables

pytestmark = pytest.mark.sql_only

_TABLES = ["spark_schema_migrations", "spark_write_progress", "spark_write_results", "spark_writes"]
# PostgreSQL also keeps the decisions of writes committed in parallel pieces.
SPARK_TABLES = {"sqlite": _TABLES, "postgres": sorted([*_TABLES, "spark_commits"])}

# The three tables as the store's migrations 004 and 008 made them before the
# Spark layer had migrations of its own: what a database made then holds.
OLD_TABLES = {
    "sqlite": """
        CREATE TABLE spark_writes (id TEXT PRIMARY KEY, started_at REAL NOT NULL);
        CREATE TABLE spark_write_results (
            id TEXT PRIMARY KEY, batch INTEGER, committed_at REAL NOT NULL,
            row_count INTEGER NOT NULL, enqueued INTEGER NOT NULL, skipped INTEGER NOT NULL);
        CREATE TABLE spark_write_progress (
            write_id TEXT NOT NULL, part INTEGER NOT NULL, row_count INTEGER NOT NULL,
            checksum INTEGER NOT NULL, enqueued INTEGER NOT NULL, skipped INTEGER NOT NULL,
            PRIMARY KEY (write_id, part));
        INSERT INTO spark_write_results VALUES ('daily-1', NULL, 1000.0, 5, 4, 1);
        INSERT INTO spark_write_results VALUES ('stream:q1', 7, 1000.0, 30, 30, 0);
    """,
    "postgres": """
        CREATE TABLE spark_writes (id text PRIMARY KEY, started_at timestamptz NOT NULL);
        CREATE TABLE spark_write_results (
            id text PRIMARY KEY, batch bigint, committed_at timestamptz NOT NULL,
            row_count bigint NOT NULL, enqueued bigint NOT NULL, skipped bigint NOT NULL);
        CREATE TABLE spark_write_progress (
            write_id text NOT NULL, part integer NOT NULL, row_count bigint NOT NULL,
            checksum bigint NOT NULL, enqueued bigint NOT NULL, skipped bigint NOT NULL,
            PRIMARY KEY (write_id, part));
        INSERT INTO spark_write_results VALUES ('daily-1', NULL, to_timestamp(1000), 5, 4, 1);
        INSERT INTO spark_write_results VALUES ('stream:q1', 7, to_timestamp(1000), 30, 30, 0);
    """,
}


def _backend(dsn: str) -> str:
    return "sqlite" if dsn.startswith("sqlite") else "postgres"


def run_sql(dsn: str, script: str) -> None:
    if _backend(dsn) == "sqlite":
        conn = sqlite3.connect(sqlite_path(dsn))
        try:
            conn.executescript(script)
        finally:
            conn.close()
    else:
        with psycopg.connect(dsn) as pg:
            pg.execute(script.encode())


def a_writer(dsn: str, write_id: str | None = None) -> ConveyorWriter:
    fields = [StructField("id", LongType()), StructField("path", StringType())]
    options = {"task": "resize", "keycolumn": "id"}
    if write_id is not None:
        options["writeid"] = write_id
    plan = WritePlan.from_options(StructType(fields), Options(options, "write"))
    return ConveyorWriter(dsn, plan)


BATCH = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "path": ["a", "b", "c"]})


def test_a_database_that_never_ran_a_spark_write_has_no_spark_table(dsn: str, store: Store) -> None:
    assert spark_tables(dsn) == []
    storage = open_storage(dsn)
    try:
        assert storage.spark_schema_version() == 0
    finally:
        storage.close()
    # Reads of jobs and events need no table of Spark's and make none.
    storage = open_storage(dsn)
    try:
        assert storage.scan_id_bounds("jobs") == (None, None)
    finally:
        storage.close()
    assert spark_tables(dsn) == []


def test_the_first_write_makes_spark_tables_by_their_own_migrations(dsn: str, store: Store) -> None:
    write = a_writer(dsn)
    assert spark_tables(dsn) == SPARK_TABLES[_backend(dsn)]
    write.commit([write.write(iter([BATCH]))])
    assert sorted(j.key for j in all_jobs(store)) == ["1", "2", "3"]
    latest = len(load_migrations("conveyor.spark.storage", f"migrations/{_backend(dsn)}"))
    storage = open_storage(dsn)
    try:
        assert storage.spark_schema_version() == latest
        assert storage.spark_migrate() == latest  # nothing pending: nothing done
    finally:
        storage.close()
    # The store's own schema version is untouched by Spark's line.
    assert store.schema_version() == len(load_migrations(f"conveyor.store.{_backend(dsn)}"))


def test_reading_a_write_result_on_a_new_database_makes_the_tables_and_finds_none(
    dsn: str, store: Store
) -> None:
    assert write_result(dsn, "nothing-yet") is None
    assert spark_tables(dsn) == SPARK_TABLES[_backend(dsn)]


def test_a_database_made_before_keeps_its_spark_tables_and_their_rows(
    dsn: str, store: Store
) -> None:
    """The tables the store's migrations used to make are adopted, rows and all."""
    run_sql(dsn, OLD_TABLES[_backend(dsn)])
    old = write_result(dsn, "daily-1")
    assert old is not None and (old.rows, old.enqueued, old.skipped) == (5, 4, 1)
    assert spark_tables(dsn) == SPARK_TABLES[_backend(dsn)]
    stream = write_result(dsn, "stream:q1")
    assert stream is not None and stream.batch == 7
    # A rerun of the write committed before the upgrade is still recognised.
    rerun = a_writer(dsn, "daily-1")
    assert rerun.done_before == old
    rerun.commit([rerun.write(iter([BATCH]))])
    assert all_jobs(store) == []
    # And new writes work on the adopted tables.
    fresh = a_writer(dsn, "daily-2")
    fresh.commit([fresh.write(iter([BATCH]))])
    assert len(all_jobs(store)) == 3


def spark_columns(dsn: str) -> list[tuple[object, ...]]:
    """Every column of Spark's tables (table, name, type, not null, key), from the catalog."""
    if _backend(dsn) == "sqlite":
        conn = sqlite3.connect(sqlite_path(dsn))
        try:
            return conn.execute(
                'SELECT m.name, c.name, c.type, c."notnull", c.pk '
                "FROM sqlite_master AS m, pragma_table_info(m.name) AS c "
                "WHERE m.type = 'table' AND m.name LIKE 'spark%' ORDER BY 1, c.cid"
            ).fetchall()
        finally:
            conn.close()
    with psycopg.connect(dsn) as pg:
        return pg.execute(
            "SELECT c.table_name, c.column_name, c.data_type, c.is_nullable, "
            "  (SELECT count(*) FROM information_schema.key_column_usage AS k "
            "   WHERE k.table_name = c.table_name AND k.column_name = c.column_name) "
            "FROM information_schema.columns AS c "
            "WHERE c.table_schema = 'public' AND c.table_name LIKE 'spark%' "
            "ORDER BY 1, c.ordinal_position"
        ).fetchall()


def test_adopted_tables_are_the_tables_spark_makes(dsn: str, store: Store) -> None:
    """A new database and one made before end with the same Spark tables, column for column."""
    storage = open_storage(dsn)
    try:
        storage.spark_migrate()
        made = spark_columns(dsn)
        run_sql(dsn, "".join(f"DROP TABLE {table};" for table in spark_tables(dsn)))
        assert spark_tables(dsn) == []
        run_sql(dsn, OLD_TABLES[_backend(dsn)])
        storage.spark_migrate()
    finally:
        storage.close()
    # With the options and caller id of 002_operations (and 003's decisions on PostgreSQL),
    # and 004's keyless count and commit path.
    assert len(made) == {"sqlite": 21, "postgres": 23}[_backend(dsn)]
    assert spark_columns(dsn) == made


def test_spark_tables_need_conveyor_tables_first(dsn: str) -> None:
    storage = open_storage(dsn)
    try:
        with pytest.raises(SchemaMissingError, match="run `conveyor migrate`"):
            storage.spark_migrate()
    finally:
        storage.close()
    assert spark_tables(dsn) == []


def test_drivers_starting_together_migrate_spark_tables_once(dsn: str, store: Store) -> None:
    versions: list[int] = []
    errors: list[BaseException] = []

    def migrate() -> None:
        storage = open_storage(dsn)
        try:
            versions.append(storage.spark_migrate())
        except BaseException as exc:  # reported below, with the test's assertion
            errors.append(exc)
        finally:
            storage.close()

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    latest = len(load_migrations("conveyor.spark.storage", f"migrations/{_backend(dsn)}"))
    assert versions == [latest] * 4
    if _backend(dsn) == "sqlite":
        conn = sqlite3.connect(sqlite_path(dsn))
        recorded = conn.execute("SELECT count(*) FROM spark_schema_migrations").fetchone()[0]
        conn.close()
    else:
        with psycopg.connect(dsn) as pg:
            row = pg.execute("SELECT count(*) FROM spark_schema_migrations").fetchone()
            recorded = row[0] if row else 0
    assert recorded == latest


def test_one_scan_builder_for_both_databases() -> None:
    """The statements differ by their placeholders, times and column reads only."""
    since = datetime(2026, 1, 2, tzinfo=UTC)
    filters = [
        ScanFilter("state", "in", ("failed", "cancelled")),
        ScanFilter("finished_at", ">=", (since,)),
        ScanFilter("key", "is null"),
        ScanFilter("queue", "in", ()),
    ]
    known = ("id", "state", "finished_at", "key", "queue")
    template = "SELECT {columns} FROM {table} WHERE {where} ORDER BY {id}"
    what = ScanRange("jobs", ["id", "state"], 1, 9, filters)
    lite, lite_params = scan_query(template, what, known=known, placeholder="?", epoch_times=True)
    pg, pg_params = scan_query(template, what, known=known, placeholder="%s")
    assert lite == (
        "SELECT id, state FROM jobs WHERE id >= ? AND id < ? AND state IN (?, ?) "
        "AND finished_at >= ? AND key IS NULL AND 1 = 0 ORDER BY id"
    )
    assert pg == lite.replace("?", "%s")
    assert lite_params == [1, 9, "failed", "cancelled", since.timestamp()]
    assert pg_params == [1, 9, "failed", "cancelled", since]
    from conveyor.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="jobs has no column"):
        scan_query(template, ScanRange("jobs", ["id; DROP"], 1, 9), known=known, placeholder="?")
