"""Spark's writes as an operator sees them: listed, cleaned up, purged, checked on reruns.

On both databases, through the data source where a user would go through it,
and by hand (a ConveyorWriter that never commits) for a driver that died.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta

import psycopg
import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from conveyor import App
from conveyor.cli import cli
from conveyor.errors import ConfigurationError
from conveyor.spark import cleanup, enqueue, schedule_cleanup, write_result, writes
from conveyor.spark.housekeeping import CLEANUP_TASK
from conveyor.spark.options import Options
from conveyor.spark.rows import WritePlan
from conveyor.spark.writer import ConveyorWriter
from conveyor.store.dsn import sqlite_path
from conveyor.store.protocols import Store
from conveyor.worker.maintenance import Maintenance
from spark_helpers import all_jobs, items, leftovers, writer

pytestmark = pytest.mark.sql_only


def _dead_driver(dsn: str, hours_ago: float = 0) -> ConveyorWriter:
    """A write whose task staged rows and whose driver never committed, started then."""
    schema = StructType([StructField("id", LongType()), StructField("path", StringType())])
    # Its own writes clear none of the others: only what the test runs does.
    options = {"task": "resize", "writeId": "lost-1", "abandonedAfterHours": "1000"}
    plan = WritePlan.from_options(schema, Options(options, "write"))
    write = ConveyorWriter(dsn, plan)
    write.write(iter([pa.RecordBatch.from_pydict({"id": [1, 2], "path": ["a", "b"]})]))
    started = datetime.now(UTC) - timedelta(hours=hours_ago)
    age = "UPDATE spark_writes SET started_at = ? WHERE id = ?"
    if dsn.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(dsn)) as conn:
            conn.execute(age, (started.timestamp(), write.write_id))
    else:
        with psycopg.connect(dsn) as pg:
            pg.execute(age.replace("?", "%s"), (started, write.write_id))
    return write


def test_writes_lists_committed_running_and_abandoned_writes(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    assert writes(dsn) == []  # no Spark write ever ran: nothing, and no tables made
    enqueue(items(spark, 6), dsn, task="resize", keyColumn="id", writeId="daily-1")
    enqueue(items(spark, 6), dsn, task="resize", keyColumn="id", writeId="daily-2")
    _dead_driver(dsn, hours_ago=30)
    listed = writes(dsn)
    assert [(w.id, w.state, w.rows, w.enqueued, w.skipped) for w in listed] == [
        ("daily-2", "committed", 6, 0, 6),
        ("daily-1", "committed", 6, 6, 0),
        ("lost-1", "abandoned", None, None, None),
    ]
    assert listed[0].at >= listed[1].at > listed[2].at
    # Open for less than abandonedAfter: still running, perhaps.
    assert writes(dsn, abandoned_after=timedelta(hours=40))[2].state == "running"

    out = CliRunner().invoke(cli, ["spark", "writes", "--dsn", dsn, "--json"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert [(w["id"], w["rows"], w["enqueued"], w["skipped"], w["state"]) for w in shown] == [
        (w.id, w.rows, w.enqueued, w.skipped, w.state) for w in listed
    ]
    table = CliRunner().invoke(cli, ["spark", "writes", "--dsn", dsn])
    assert table.exit_code == 0 and "daily-1" in table.output and "abandoned" in table.output


def test_cleanup_clears_abandoned_staging_now_and_purges_old_results(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    enqueue(items(spark, 4), dsn, task="resize", writeId="old-1")
    _dead_driver(dsn, hours_ago=25)
    running = _dead_driver(dsn)  # opened just now: left alone
    assert len(leftovers(dsn)[0]) == 2

    out = CliRunner().invoke(cli, ["spark", "cleanup", "--dsn", dsn])
    assert out.exit_code == 0, out.output
    assert "Cleared 1 abandoned writes (lost-1); purged 0 results." in out.output
    tables, open_writes = leftovers(dsn)
    assert open_writes == 1 and len(tables) == 1  # the running one's
    assert write_result(dsn, "old-1") is not None  # younger than 30 days: kept

    running.abort([])
    done = cleanup(dsn, results_retention=timedelta(0))
    assert (done.cleared, done.purged) == ([], 1)
    assert write_result(dsn, "old-1") is None
    # Its writeId is free again: a rerun enqueues anew (no key holds the rows back).
    assert enqueue(items(spark, 4), dsn, task="resize", writeId="old-1").enqueued == 4
    assert len(all_jobs(store)) == 8
    assert leftovers(dsn) == ([], 0)


def test_maintenance_runs_the_cleanup_on_its_schedule(dsn: str, store: Store) -> None:
    _dead_driver(dsn, hours_ago=25)
    app = App(dsn)
    try:
        schedule_cleanup(app, dsn, every=timedelta(minutes=10))
        assert [p.task for p in app.periodic_tasks] == [CLEANUP_TASK]
        Maintenance(app.runtime, "maintainer", 1.0).run_once()  # enqueues the tick
        with app.worker(queues=["default"], burst=True, maintenance=False) as worker:
            assert worker.wait_stopped(30)
        (job,) = [j for j in all_jobs(store) if j.task == CLEANUP_TASK]
        assert job.state == "succeeded"
        assert leftovers(dsn) == ([], 0)
        assert writes(dsn) == []
    finally:
        app.close()


def test_a_rerun_under_a_write_id_with_other_options_is_refused_naming_them(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    first = enqueue(items(spark, 5), dsn, task="resize", keyColumn="id", writeId="w-1")
    # The same options (and other ways of running it): enqueues nothing, says so.
    again = enqueue(items(spark, 5), dsn, task="resize", keyColumn="id", writeId="w-1", batchSize=2)
    assert (again.new, again.enqueued) == (False, first.enqueued)
    with pytest.raises(AnalysisException) as caught:
        enqueue(items(spark, 5), dsn, task="thumbnail", writeId="w-1")
    message = str(caught.value)
    assert "writeId 'w-1' was committed before with other options" in message
    assert "keyColumn was 'id', now not given" in message
    assert "task was 'resize', now 'thumbnail'" in message
    assert len(all_jobs(store)) == 5


def test_a_dataframe_without_columns_is_refused(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.range(3).select()
    with pytest.raises(AnalysisException, match="the DataFrame has no columns"):
        writer(frame, dsn, task="resize").save()
    assert all_jobs(store) == []


def test_a_misspelt_option_is_quoted_as_typed(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match=r'unknown option "keyColum".*"keyColumn"'):
        enqueue(None, dsn, task="resize", keyColum="id")  # type: ignore[arg-type]
