"""The Spark data source beside the store's own enqueue and a plain read, same run, same machine.

    python benchmarks/spark.py                         # both backends, 1,000,000 rows
    python benchmarks/spark.py --backend sqlite --rows 200000
    python benchmarks/spark.py --pg-dsn postgresql://user@host:5432/db
    python benchmarks/spark.py --backend postgres --tuned   # fsync off, prepared transactions

For each backend, on fresh databases:

- Spark enqueue: a DataFrame of ``--rows`` rows (an id used as the key column,
  two task arguments; ``excludeColumns`` keeps the key out of the arguments,
  so the jobs are the store enqueue's) written with ``format("conveyor")``,
  atomic (staged, then moved: on PostgreSQL in parallel pieces, one per
  partition, when the server has room for prepared transactions, else in one
  transaction; and again with ``commitPieces=1``, moved in one transaction),
  then with ``atomic=false`` (each batch of each partition commits on its own,
  as the JDBC writer's partitions do);
- store enqueue_many: the same jobs through ``Store.job_insert_many`` in
  batches of 10,000, payloads encoded in the timed loop as a producer would;
- Spark read: every column of every job, ``format("conveyor")`` into Spark's
  ``noop`` sink (the rows are produced and converted, then dropped);
- plain read: ``SELECT *`` of the same jobs on one connection, every row
  fetched into Python.

On PostgreSQL, Spark's own JDBC data source beside it, on the same server in
the same session (PostgreSQL's JDBC driver: Debian's libpostgresql-jdbc-java,
which ``scripts/ensure-pg-jdbc.sh`` installs; skipped with a note without it),
tuned as a data engineer runs it:

- JDBC write: the same rows, shaped as jobs (queue, task, state, kwargs as
  JSON, run_at, key, ...), with ``df.write.jdbc`` in append mode into
  ``CREATE TABLE jdbc_jobs (LIKE jobs INCLUDING ALL)``: the same columns,
  defaults, constraints and indexes as ``jobs``, each partition committing on
  its own (not atomic, no events, no key rule), with
  ``reWriteBatchedInserts=true`` (the driver sends multi-row INSERTs: twice
  the rate of Spark's defaults) and ``batchsize`` 10,000;
- JDBC read: ``jobs`` with ``spark.read.jdbc``, split by id into as many
  partitions as the conveyor read (``partitionColumn``, ``lowerBound``,
  ``upperBound``, ``numPartitions``, as Spark's JDBC guide advises for a
  parallel read), ``fetchsize`` 10,000, into the ``noop`` sink.

The server the figures come from matters as much as the code: without
``--pg-dsn`` the script starts a stock one (``fsync`` and ``full_page_writes``
on, ``max_prepared_transactions`` 0, as PostgreSQL, RDS and Cloud SQL ship),
where an atomic write commits in one transaction; ``--tuned`` starts one with
``fsync`` off and room for prepared transactions (parallel pieces). The
server's ``fsync``, ``synchronous_commit`` and ``max_prepared_transactions``
are printed beside the figures, whichever server it is.

And what bounds those figures on this machine, measured in the same run:

- the atomic write's two phases run by hand in this process (no Spark): the
  staging of every row, then ``commit()``, which moves the staged rows into
  ``jobs`` with their events in one transaction. Spark parallelises the
  staging, never the move, so no atomic Spark enqueue beats the move's rate;
- Spark's own intake: a Python data source that yields one Arrow batch of
  real jobs (all columns) over and over, into the same ``noop`` sink, with as
  many partitions as the conveyor read. No database read beats it.

Spark runs in local mode on all cores; a small write and read first warm it up
(the first Python data source query in a session costs seconds once).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from conveyor.job import NewJob
from conveyor.spark.options import Options
from conveyor.spark.reader import ROWS_PER_PARTITION, ConveyorReader, IdRange
from conveyor.spark.tables import TABLES, struct_of
from conveyor.store.dsn import open_store

HERE = Path(__file__).resolve().parent
STORE_BATCH = 10_000
#: PostgreSQL's JDBC driver as Debian installs it (scripts/ensure-pg-jdbc.sh).
PG_JDBC_JAR = Path("/usr/share/java/postgresql.jar")
#: Rows per JDBC batch (with reWriteBatchedInserts) and per fetch: what a data
#: engineer sets, Spark's defaults (1,000 and the driver's 0, everything at once)
#: being tuned for neither.
JDBC_BATCH = 10_000
JDBC_FETCH = 10_000
#: The server settings that decide which commit path runs and what a commit costs.
SERVER_SETTINGS = ("fsync", "full_page_writes", "synchronous_commit", "max_prepared_transactions")
#: A stock server's settings, over the tests' server's (fsync off, prepared transactions).
STOCK = ("-c fsync=on", "-c full_page_writes=on", "-c max_prepared_transactions=0")
TUNED = ("-c fsync=off", "-c full_page_writes=off", "-c max_prepared_transactions=64")


@dataclass
class Result:
    backend: str
    measure: str
    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else float("nan")


def load() -> str:
    """The machine's load averages: a busy machine moves every figure (print them beside)."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


LOAD_BEFORE = load()


def timed(work: Callable[[], int]) -> tuple[int, float]:
    start = time.perf_counter()
    rows = work()
    return rows, time.perf_counter() - start


def fresh_database(backend: str, base: str, folder: Path, name: str) -> str:
    """A new empty database for one measurement, migrated."""
    if backend == "sqlite":
        dsn = f"sqlite:///{folder / (name + '.db')}"
    else:
        import psycopg
        from psycopg import sql

        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import dsn_with_dbname

        with psycopg.connect(base, autocommit=True) as admin:
            ident = sql.Identifier(name)
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(ident))
        dsn = dsn_with_dbname(base, name)
    store = open_store(dsn)
    store.migrate()
    store.close()
    return dsn


def count_jobs(dsn: str) -> int:
    store = open_store(dsn)
    try:
        if dsn.startswith("sqlite"):
            conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
            try:
                count: int = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
            finally:
                conn.close()
            return count
        import psycopg

        with psycopg.connect(dsn) as pg:
            row = pg.execute("SELECT count(*) FROM jobs").fetchone()
            return int(row[0]) if row else 0
    finally:
        store.close()


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from conveyor.spark import session

    spark = session(
        "local[*]",
        "conveyor-benchmark",
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "3g",
            **({"spark.jars": str(PG_JDBC_JAR)} if PG_JDBC_JAR.is_file() else {}),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def frame(spark: Any, rows: int) -> Any:
    partitions = max(2, os.cpu_count() or 2)
    return spark.range(0, rows, numPartitions=partitions).selectExpr(
        "id", "concat('s3://bucket/img-', id, '.png') AS path", "cast(id % 100 AS int) AS size"
    )


def spark_enqueue(spark: Any, dsn: str, rows: int, **options: str) -> int:
    (
        frame(spark, rows)
        .write.format("conveyor")
        .option("dsn", dsn)
        .option("task", "resize")
        .option("keyColumn", "id")
        .option("excludeColumns", "id")
        .options(**options)
        .mode("append")
        .save()
    )
    return count_jobs(dsn)


def store_enqueue(dsn: str, rows: int) -> int:
    store = open_store(dsn)
    try:
        now = datetime.now(UTC)
        for start in range(0, rows, STORE_BATCH):
            batch = [
                NewJob(
                    queue="default",
                    task="resize",
                    args_json="[]",
                    kwargs_json=json.dumps(
                        {"path": f"s3://bucket/img-{i}.png", "size": i % 100},
                        separators=(",", ":"),
                    ),
                    run_at=now,
                    key=str(i),
                )
                for i in range(start, min(start + STORE_BATCH, rows))
            ]
            store.job_insert_many(batch, now)
    finally:
        store.close()
    return count_jobs(dsn)


def spark_read(spark: Any, dsn: str) -> int:
    jobs = spark.read.format("conveyor").option("dsn", dsn).option("table", "jobs").load()
    jobs.write.format("noop").mode("overwrite").save()
    return count_jobs(dsn)


def write_phases(dsn: str, rows: int) -> tuple[Result, Result]:
    """The atomic write's staging and final move, timed apart, in this process."""
    import pyarrow as pa
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField

    from conveyor.spark.rows import WritePlan
    from conveyor.spark.writer import ConveyorWriter

    schema = StructType(
        [
            StructField("id", LongType()),
            StructField("path", StringType()),
            StructField("size", IntegerType()),
        ]
    )
    options = Options({"task": "resize", "keyColumn": "id", "excludeColumns": "id"}, "write")
    plan = WritePlan.from_options(schema, options)
    writer = ConveyorWriter(dsn, plan)

    def batches() -> Any:
        for start in range(0, rows, STORE_BATCH):
            ids = range(start, min(start + STORE_BATCH, rows))
            yield pa.record_batch(
                [
                    pa.array(ids, pa.int64()),
                    pa.array([f"s3://bucket/img-{i}.png" for i in ids], pa.string()),
                    pa.array([i % 100 for i in ids], pa.int32()),
                ],
                names=["id", "path", "size"],
            )

    backend = "sqlite" if dsn.startswith("sqlite") else "postgres"
    started = time.perf_counter()
    message = writer.write(batches())
    staged = time.perf_counter() - started
    started = time.perf_counter()
    writer.commit([message])
    moved = time.perf_counter() - started
    return (
        Result(backend, "bound: atomic write, staging in one process", message.rows, staged),
        Result(backend, "bound: atomic write, final move (commit)", count_jobs(dsn), moved),
    )


class OneBatchReader(DataSourceReader):
    """Yields one batch of real jobs over and over until ``rows`` are out: no database read."""

    def __init__(self, dsn: str, rows: int, partitions: int) -> None:
        self.dsn, self.rows, self.count = dsn, rows, partitions

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(i) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Any:
        reader = ConveyorReader(self.dsn, "jobs", TABLES["jobs"], Options({}, "read"))
        batch = next(iter(reader.read(InputPartition(IdRange(1, STORE_BATCH + 1)))))
        for _ in range(self.rows // self.count // batch.num_rows):
            yield batch


class IntakeSource(DataSource):
    """``format("conveyor_bench_intake")``: Spark's intake from a Python data source, alone."""

    @classmethod
    def name(cls) -> str:
        return "conveyor_bench_intake"

    def schema(self) -> StructType:
        return struct_of(TABLES["jobs"])

    def reader(self, schema: StructType) -> DataSourceReader:
        rows = int(self.options["rows"])
        return OneBatchReader(self.options["dsn"], rows, int(self.options["partitions"]))


def spark_intake(spark: Any, dsn: str, rows: int) -> int:
    """Spark's ceiling for a Python data source read here: no database behind the batches."""
    partitions = max(1, rows // ROWS_PER_PARTITION)
    spark.dataSource.register(IntakeSource)
    jobs = (
        spark.read.format("conveyor_bench_intake")
        .option("dsn", dsn)
        .option("rows", str(rows))
        .option("partitions", str(partitions))
        .load()
    )
    jobs.write.format("noop").mode("overwrite").save()
    return rows // partitions // STORE_BATCH * STORE_BATCH * partitions


def plain_read(dsn: str) -> int:
    rows = 0
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        try:
            cursor = conn.execute("SELECT * FROM jobs")
            while chunk := cursor.fetchmany(10_000):
                rows += len(chunk)
        finally:
            conn.close()
        return rows
    import psycopg

    with psycopg.connect(dsn) as pg, pg.cursor(name="everything") as cursor:
        cursor.itersize = 10_000
        cursor.execute("SELECT * FROM jobs")
        while chunk := cursor.fetchmany(10_000):
            rows += len(chunk)
    return rows


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    """A JDBC URL and connection properties for a libpq DSN (postgresql://user@host:port/db).

    ``stringtype=unspecified``: Spark sends strings as text, and the server casts
    them to the column's type (json) as it does for conveyor's COPY.
    """
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(dsn)
    properties = {"driver": "org.postgresql.Driver", "stringtype": "unspecified"}
    if parts.username:
        properties["user"] = unquote(parts.username)
    if parts.password:
        properties["password"] = unquote(parts.password)
    host = parts.hostname or "localhost"
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    if "host" in query and query["host"].startswith("/"):
        raise SystemExit("the JDBC sides need a TCP PostgreSQL DSN (host:port), not a socket")
    return f"jdbc:postgresql://{host}:{parts.port or 5432}{parts.path}", properties


def jdbc_enqueue(spark: Any, dsn: str, rows: int) -> int:
    """Spark's JDBC writer: the same rows as jobs, into a table made LIKE jobs INCLUDING ALL."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS jdbc_jobs")
        pg.execute("CREATE TABLE jdbc_jobs (LIKE jobs INCLUDING ALL)")
    url, properties = jdbc_url(dsn)
    jobs = frame(spark, rows).selectExpr(
        "'default' AS queue",
        "'resize' AS task",
        "'queued' AS state",
        "'[]' AS args",
        "to_json(named_struct('path', path, 'size', size)) AS kwargs",
        "0 AS priority",
        "current_timestamp() AS run_at",
        "0 AS attempts",
        "3 AS max_attempts",
        "cast(id AS string) AS key",
        "false AS cancel_requested",
        "current_timestamp() AS created_at",
    )
    tuned = {**properties, "reWriteBatchedInserts": "true", "batchsize": str(JDBC_BATCH)}
    jobs.write.jdbc(url, "jdbc_jobs", mode="append", properties=tuned)
    with psycopg.connect(dsn) as pg:
        row = pg.execute("SELECT count(*) FROM jdbc_jobs").fetchone()
    return int(row[0]) if row else 0


def jdbc_read(spark: Any, dsn: str) -> int:
    """Spark's JDBC reader: every column of jobs, split by id like the conveyor read."""
    import psycopg

    with psycopg.connect(dsn) as pg:
        low, high = pg.execute("SELECT min(id), max(id) FROM jobs").fetchone() or (1, 1)
    url, properties = jdbc_url(dsn)
    partitions = max(1, -(-(high - low + 1) // ROWS_PER_PARTITION))
    jobs = spark.read.jdbc(
        url,
        "jobs",
        column="id",
        lowerBound=low,
        upperBound=high + 1,
        numPartitions=partitions,
        properties={**properties, "fetchsize": str(JDBC_FETCH)},
    )
    jobs.write.format("noop").mode("overwrite").save()
    return count_jobs(dsn)


def jdbc_results(spark: Any, base: str, folder: Path, rows: int, read_dsn: str) -> list[Result]:
    if not PG_JDBC_JAR.is_file():
        print(f"no {PG_JDBC_JAR}: run scripts/ensure-pg-jdbc.sh for the JDBC sides")
        return []
    results = []
    jdbc_dsn = fresh_database("postgres", base, folder, "bench_jdbc")
    jdbc_enqueue(spark, jdbc_dsn, 1_000)  # warm: the driver's classes load once
    done, seconds = timed(lambda: jdbc_enqueue(spark, jdbc_dsn, rows))
    measure = "JDBC write into LIKE jobs INCLUDING ALL, reWriteBatchedInserts"
    results.append(Result("postgres", measure, done, seconds))
    done, seconds = timed(lambda: jdbc_read(spark, read_dsn))
    results.append(Result("postgres", "JDBC read, all columns, partitioned by id", done, seconds))
    return results


def bench_backend(spark: Any, backend: str, base: str, folder: Path, rows: int) -> list[Result]:
    warm = fresh_database(backend, base, folder, "bench_warm")
    spark_enqueue(spark, warm, 1_000)
    spark_read(spark, warm)

    results = []
    store_dsn = fresh_database(backend, base, folder, "bench_store")
    done, seconds = timed(lambda: store_enqueue(store_dsn, rows))
    results.append(Result(backend, "store enqueue_many", done, seconds))

    spark_dsn = fresh_database(backend, base, folder, "bench_spark")
    done, seconds = timed(lambda: spark_enqueue(spark, spark_dsn, rows))
    results.append(Result(backend, "Spark enqueue (atomic, key column)", done, seconds))
    if backend == "postgres":
        # The same write committed in one transaction, not in parallel pieces.
        single = fresh_database(backend, base, folder, "bench_single")
        done, seconds = timed(lambda: spark_enqueue(spark, single, rows, commitPieces="1"))
        results.append(Result(backend, "Spark enqueue, one-transaction commit", done, seconds))

    per_partition = fresh_database(backend, base, folder, "bench_per_partition")
    done, seconds = timed(lambda: spark_enqueue(spark, per_partition, rows, atomic="false"))
    results.append(Result(backend, "Spark enqueue, atomic=false (per partition)", done, seconds))

    done, seconds = timed(lambda: plain_read(spark_dsn))
    results.append(Result(backend, "plain read, one connection", done, seconds))
    done, seconds = timed(lambda: spark_read(spark, spark_dsn))
    results.append(Result(backend, "Spark read, all columns", done, seconds))
    done, seconds = timed(lambda: spark_intake(spark, spark_dsn, rows))
    results.append(Result(backend, "bound: Spark intake, one batch over and over", done, seconds))
    if backend == "postgres":
        results += jdbc_results(spark, base, folder, rows, spark_dsn)
    results += write_phases(fresh_database(backend, base, folder, "bench_phases"), rows)
    for result in results:
        # The intake yields whole batches: it may hand out a few rows less.
        if result.rows != rows and "intake" not in result.measure:
            raise SystemExit(f"{result.measure} on {backend}: {result.rows} jobs, not {rows}")
    return results


@contextmanager
def postgres(dsn: str | None, tuned: bool) -> Iterator[str]:
    """Yield ``dsn`` when given; otherwise a throwaway server, stock unless ``tuned``."""
    if dsn:
        yield dsn
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    from pg_server import PgServer

    server = PgServer(extra_options=TUNED if tuned else STOCK)
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()


def server_settings(dsn: str) -> str:
    """The settings of the server that decide the figures, as one line."""
    import psycopg

    with psycopg.connect(dsn) as pg:
        shown = [
            f"{name}={row[0] if (row := pg.execute(f'SHOW {name}').fetchone()) else '?'}"
            for name in SERVER_SETTINGS
        ]
    return "PostgreSQL server: " + ", ".join(shown)


def print_table(results: list[Result]) -> None:
    print("| backend | measure | rows | seconds | rows/s |")
    print("|---|---|---:|---:|---:|")
    for r in results:
        print(f"| {r.backend} | {r.measure} | {r.rows:,} | {r.seconds:.2f} | {r.rate:,.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--pg-dsn", help="use this PostgreSQL server (it gets bench_* databases)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="without --pg-dsn: a server with fsync off and prepared transactions, not a stock one",
    )
    options = parser.parse_args()

    spark = spark_session()
    results: list[Result] = []
    settings = ""
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            if options.backend in ("sqlite", "all"):
                results += bench_backend(spark, "sqlite", "", folder, options.rows)
            if options.backend in ("postgres", "all"):
                with postgres(options.pg_dsn, options.tuned) as base:
                    settings = server_settings(base)
                    results += bench_backend(spark, "postgres", base, folder, options.rows)
    finally:
        spark.stop()
    if settings:
        print(settings)
    print(f"load average before and after: {LOAD_BEFORE} / {load()}")
    print_table(results)


if __name__ == "__main__":
    main()
