"""The data source and the pipelines under Spark Connect, on both databases.

The ``connect`` fixture is a Spark Connect session of a local Connect server
(see spark_fixtures): the client holds no SparkContext and no RDDs, and every
plan is analysed on the server. Each test is the classic test's check, run
through Connect.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor.job import NewJob
from conveyor.spark import archive, batch_results, enqueue, read_table, report
from conveyor.store.protocols import Store
from spark_helpers import all_jobs, items, leftovers
from test_spark_pipelines import T0, seed_archive_jobs, seed_batch, seed_report_jobs
from test_spark_streams import run_stream, sink_runs_exactly_once

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (test_spark_options.py).
pytestmark = pytest.mark.sql_only

DAY = timedelta(days=1)


def test_write_and_read_under_connect(connect: Any, dsn: str, store: Store) -> None:
    from pyspark.sql import functions as F

    result = enqueue(items(connect, 40), dsn, task="resize", keyColumn="id")
    assert (result.rows, result.enqueued, result.skipped) == (40, 40, 0)
    again = enqueue(items(connect, 40), dsn, task="resize", keyColumn="id")
    assert (again.enqueued, again.skipped) == (0, 40)
    assert len(all_jobs(store)) == 40
    assert leftovers(dsn) == ([], 0)

    jobs = read_table(connect, dsn, "jobs", state="queued", columns=["id", "key", "kwargs"])
    assert jobs.count() == 40
    assert sorted(int(r.key) for r in jobs.collect()) == list(range(40))
    source = connect.read.format("conveyor").option("dsn", dsn)
    seqs = [r.seq for r in source.option("endingOffsets", "11").load().select("seq").collect()]
    assert seqs and max(seqs) <= 10
    # An enqueued event counts its jobs: one each on SQLite, one per statement on PostgreSQL.
    counted = connect.read.format("conveyor").option("dsn", dsn).load()
    assert counted.agg(F.sum(F.coalesce(F.col("jobs"), F.lit(1)))).first()[0] == 40


def test_sql_table_under_connect(connect: Any, dsn: str, store: Store) -> None:
    name = f"c{abs(hash(dsn)) % 10**8}"
    connect.sql(f"DROP TABLE IF EXISTS {name}")
    connect.sql(
        f"CREATE TABLE {name} USING conveyor OPTIONS (dsn '{dsn}', task 't', schema 'n INT')"
    )
    try:
        connect.sql(f"INSERT INTO {name} VALUES (1), (2)")
        connect.sql(f"INSERT INTO {name} SELECT CAST(id AS INT) AS n FROM range(3, 5)")
        connect.sql(f"INSERT INTO {name} BY NAME SELECT 5 AS n")
    finally:
        connect.sql(f"DROP TABLE IF EXISTS {name}")
    assert sorted(j.kwargs["n"] for j in all_jobs(store)) == [1, 2, 3, 4, 5]


def test_event_stream_under_connect(connect: Any, dsn: str, store: Store, tmp_path: Path) -> None:
    for _ in range(4):  # one enqueue each: an event each on every store
        store.job_insert_many([NewJob("q", "t", "[]", "{}", T0)], T0)
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    assert run_stream(connect, dsn, out, checkpoint, maxEventsPerTrigger="3") == [1, 2, 3, 4]
    for _ in range(2):
        store.job_insert_many([NewJob("q", "t", "[]", "{}", T0)], T0)
    assert run_stream(connect, dsn, out, checkpoint) == [1, 2, 3, 4, 5, 6]


def test_streaming_sink_under_connect(connect: Any, dsn: str, store: Store, tmp_path: Path) -> None:
    sink_runs_exactly_once(connect, dsn, store, tmp_path)


def test_report_under_connect(connect: Any, dsn: str, store: Store, tmp_path: Path) -> None:
    seed_report_jobs(store)
    now = T0 + timedelta(hours=1)
    result = report(connect, dsn, since=timedelta(hours=1), out=tmp_path / "r", now=now)
    summary = {(r["queue"], r["task"]): r for r in result.summary.collect()}
    resize = summary[("images", "resize")]
    assert (resize["attempts"], resize["succeeded"], resize["wait_p50"]) == (20, 20, 10)
    errors = [r["error"] for r in result.errors.collect()]
    assert errors[0] == "TimeoutError: upstream slow"
    assert (tmp_path / "r" / "throughput.png").is_file()


def test_archive_into_a_new_folder_under_connect(
    connect: Any, dsn: str, store: Store, tmp_path: Path
) -> None:
    seeded = seed_archive_jobs(store)
    to = str(tmp_path / "new" / "archive")
    result = archive(connect, dsn, older_than=7 * DAY, to=to, now=T0 + 10 * DAY)
    assert (result.selected, result.written, result.deleted) == (6, 6, 6)
    assert all(store.job_get(j.id) is None for j in seeded.old)
    assert connect.read.parquet(to).count() == 6
    rerun = archive(connect, dsn, older_than=7 * DAY, to=to, now=T0 + 10 * DAY)
    assert (rerun.selected, rerun.written, rerun.deleted) == (0, 0, 0)


def test_batch_results_without_a_schema_under_connect(connect: Any, dsn: str, store: Store) -> None:
    seed_batch(store, "b1", ['{"width": 100}', '{"width": 250}', None])
    rows = batch_results(connect, dsn, "b1").collect()
    assert [r["result_value"]["width"] if r["result_value"] else None for r in rows] == [
        100,
        250,
        None,
    ]
    seed_batch(store, "pending", [None])
    assert [r["result_value"] for r in batch_results(connect, dsn, "pending").collect()] == [None]


@pytest.mark.parametrize("when", [datetime(2026, 1, 1, tzinfo=UTC)])
def test_the_connect_fixture_leaves_classic_sessions_working(spark: Any, when: datetime) -> None:
    from pyspark.sql import functions as F

    # After Connect tests, PySpark's functions build classic columns again.
    assert spark.range(2).select((F.col("id") + 1).alias("n")).collect()[1].n == 2
