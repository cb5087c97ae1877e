"""The ``conveyor`` Spark data source on both databases, with a real local Spark.

Writes are checked through the store (what a worker would see), reads against
jobs the store made, and pushdown through the statements the reader ran (its
``traceFile`` option records each statement and how many rows it returned).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from conveyor.job import JobState, NewJob
from conveyor.spark import read_table
from conveyor.spark.options import Options
from conveyor.spark.rows import WritePlan
from conveyor.spark.storage import stage_prefix
from conveyor.spark.writer import ConveyorWriter, WriteEndedError
from conveyor.store.dsn import open_store, sqlite_path
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from outcomes import Failure
from spark_helpers import all_jobs, items, leftovers, writer
from store_fixtures import event_committed_late

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (test_spark_options.py).
pytestmark = pytest.mark.sql_only

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# --- write = enqueue -----------------------------------------------------------


def test_write_makes_one_job_per_row_with_named_columns(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame(
        [
            (1, "a.png", "hi", 5, T0 + timedelta(hours=1), "g1", {"w": 10}),
            (2, "b.png", "lo", None, None, None, {"w": 20}),
            (3, "c.png", None, -1, T0, "g1", None),
        ],
        "id long, path string, q string, prio int, at timestamp, grp string, opts map<string,int>",
    )
    listener = None
    if dsn.startswith("postgres"):
        # Workers wait on this channel: the move into jobs must wake them.
        listener = psycopg.connect(dsn, autocommit=True)
        listener.execute("LISTEN conveyor_jobs")
    writer(
        frame, dsn, task="resize", keyColumn="id", queueColumn="q", priorityColumn="prio",
        runAtColumn="at", groupColumn="grp", batch="b1", queue="images",
    ).save()  # fmt: skip
    if listener is not None:
        with listener:
            woken = {n.payload for n in listener.notifies(timeout=2, stop_after=3)}
        assert woken == {"hi", "lo", "images"}

    jobs = sorted(all_jobs(store), key=lambda j: j.key)
    assert [j.key for j in jobs] == ["1", "2", "3"]
    assert [j.queue for j in jobs] == ["hi", "lo", "images"]  # a null queue: the option's
    assert [j.priority for j in jobs] == [5, 0, -1]
    assert [j.group for j in jobs] == ["g1", None, "g1"]
    assert {j.batch for j in jobs} == {"b1"}
    assert {j.task for j in jobs} == {"resize"}
    assert jobs[0].run_at == T0 + timedelta(hours=1)
    assert jobs[2].run_at == T0
    assert jobs[1].run_at == jobs[1].created_at  # no run_at: ready when the write commits
    # Columns not named by an option are the task's keyword arguments; maps are objects.
    # The handler is not known (no app option): the key, priority, run_at and group
    # columns reach it too; the queue column only routes.
    assert jobs[0].kwargs == {
        "path": "a.png", "opts": {"w": 10}, "id": 1, "prio": 5,
        "at": (T0 + timedelta(hours=1)).isoformat(), "grp": "g1",
    }  # fmt: skip
    assert jobs[2].kwargs == {
        "path": "c.png",
        "opts": None,
        "id": 3,
        "prio": -1,
        "at": T0.isoformat(),
        "grp": "g1",
    }
    assert all(j.args == [] and j.state == JobState.QUEUED for j in jobs)
    for job in jobs:
        assert [e.kind for e in store.event_list(job.id)] == ["enqueued"]
    assert leftovers(dsn) == ([], 0)


def test_job_ids_come_from_the_store_so_later_enqueues_never_collide(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    first = store.job_insert_many([NewJob("default", "t", "[]", "{}", T0)], T0)[0]
    writer(items(spark, 200), dsn, task="resize").save()
    after = store.job_insert_many([NewJob("default", "t", "[]", "{}", T0)], T0)[0]
    ids = sorted(j.id for j in all_jobs(store))
    assert len(ids) == len(set(ids)) == 202
    assert ids[0] == first.id and ids[-1] == after.id


def test_rerun_with_a_key_column_enqueues_nothing_twice(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = items(spark, 300)
    writer(frame, dsn, task="resize", keyColumn="path").save()
    writer(frame, dsn, task="resize", keyColumn="path").save()
    jobs = all_jobs(store)
    assert len(jobs) == 300
    assert len({j.key for j in jobs}) == 300
    # Once jobs have finished their keys are free again, unless unique is "forever".
    claimed = store.job_claim(["default"], 10, "w", timedelta(minutes=1), datetime.now(UTC))
    store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in claimed], T0)
    finished = frame.where(F.col("path").isin([j.key for j in claimed]))
    writer(finished, dsn, task="resize", keyColumn="path", unique="forever").save()
    assert len(all_jobs(store)) == 300
    writer(finished, dsn, task="resize", keyColumn="path").save()
    assert len(all_jobs(store)) == 310


def test_a_retried_task_does_not_duplicate_jobs(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    @F.udf(returnType=LongType(), useArrow=False)
    def fail_first_attempt(value: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        # The first attempt of partition 1 dies after staging some batches.
        if value == 350 and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("injected task failure")
        return value

    frame = items(spark, 400).withColumn("id", fail_first_attempt("id"))
    writer(frame, dsn, task="resize", keyColumn="id", batchSize="50").save()
    jobs = all_jobs(store)
    assert sorted(int(j.key) for j in jobs) == list(range(400))
    assert leftovers(dsn) == ([], 0)


def test_a_failed_write_enqueues_nothing(spark: SparkSession, dsn: str, store: Store) -> None:
    @F.udf(returnType=LongType(), useArrow=False)
    def always_fail(value: int) -> int:
        if value == 390:
            raise RuntimeError("injected task failure")
        return value

    frame = items(spark, 400).withColumn("id", always_fail("id"))
    with pytest.raises(Exception, match="injected task failure"):
        writer(frame, dsn, task="resize", keyColumn="id", batchSize="50").save()
    # Partition 0 staged all its rows and partition 1 most of its own: none is a job.
    assert all_jobs(store) == []
    assert store.event_since(0, 10) == []
    assert leftovers(dsn) == ([], 0)


def test_a_task_that_outlives_its_write_stages_nothing(dsn: str, store: Store) -> None:
    from pyspark.sql.types import StructField

    schema = StructType([StructField("id", LongType()), StructField("path", StringType())])
    plan = WritePlan.from_options(
        schema, Options({"task": "resize", "keycolumn": "id", "batchsize": "2"}, "write")
    )
    write = ConveyorWriter(dsn, plan)
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "path": ["a", "b", "c"]})
    # A task stages rows, then the driver aborts: its staging goes with the write.
    write.write(iter([batch]))
    assert len(leftovers(dsn)[0]) == 1
    write.abort([])
    assert leftovers(dsn) == ([], 0)
    # A cancelled task that keeps going after the abort (Spark ends its input
    # early, and it returns normally) finds the write closed.
    with pytest.raises(WriteEndedError):
        write.write(iter([batch]))
    assert leftovers(dsn) == ([], 0)
    assert all_jobs(store) == []


def test_a_write_abandoned_by_its_driver_is_cleared_by_the_next(dsn: str, store: Store) -> None:
    from pyspark.sql.types import StructField

    from conveyor.errors import ConfigurationError

    schema = StructType([StructField("id", LongType()), StructField("path", StringType())])
    options = {"task": "resize", "keycolumn": "id", "abandonedafterhours": "2"}
    plan = WritePlan.from_options(schema, Options(options, "write"))
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "path": ["a", "b", "c"]})
    # Two drivers that staged rows and never committed or aborted: one three
    # hours ago (dead), one a minute ago (perhaps still running).
    dead, running = ConveyorWriter(dsn, plan), ConveyorWriter(dsn, plan)
    dead.write(iter([batch]))
    running.write(iter([batch]))
    three_hours_ago = datetime.now(UTC) - timedelta(hours=3)
    age = "UPDATE spark_writes SET started_at = ? WHERE id = ?"
    if dsn.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(dsn)) as conn:
            conn.execute(age, (three_hours_ago.timestamp(), dead.write_id))
    else:
        with psycopg.connect(dsn) as pg:
            pg.execute(age.replace("?", "%s"), (three_hours_ago, dead.write_id))
    assert len(leftovers(dsn)[0]) == 2

    fresh = ConveyorWriter(dsn, plan)
    tables, open_writes = leftovers(dsn)
    assert open_writes == 2  # running and fresh
    assert [t for t in tables if t.startswith(stage_prefix(dead.write_id))] == []
    assert [t for t in tables if t.startswith(stage_prefix(running.write_id))] != []
    with pytest.raises(WriteEndedError):
        dead.write(iter([batch]))
    fresh.commit([fresh.write(iter([batch]))])
    assert sorted(j.key for j in all_jobs(store)) == ["1", "2", "3"]
    running.abort([])
    assert leftovers(dsn) == ([], 0)
    with pytest.raises(ConfigurationError, match="abandonedAfterHours"):
        WritePlan.from_options(schema, Options({**options, "abandonedafterhours": "0"}, "write"))


def test_values_that_cannot_be_json_fail_naming_column_and_row(
    spark: SparkSession, sqlite_store: tuple[str, Store]
) -> None:
    dsn, store = sqlite_store
    frame = spark.createDataFrame(
        [(1, 0.5, None), (2, float("nan"), "x"), (3, 1.0, "y")],
        "id long, score double, note string",
    ).coalesce(1)
    with pytest.raises(Exception, match=r"column 'score', row 1 of partition 0.*JSON"):
        writer(frame, dsn, task="rank").save()
    assert all_jobs(store) == []
    # Nulls are fine: a task argument may be None.
    writer(frame.where("id != 2"), dsn, task="rank").save()
    assert sorted(j.kwargs["note"] or "" for j in all_jobs(store)) == ["", "y"]


def test_options_are_checked_before_anything_runs(
    spark: SparkSession, sqlite_store: tuple[str, Store]
) -> None:
    dsn = sqlite_store[0]
    with pytest.raises(AnalysisException, match="keyColumn names column 'nope'"):
        writer(items(spark, 3), dsn, task="t", keyColumn="nope").save()
    with pytest.raises(AnalysisException, match="taskColumn"):
        writer(items(spark, 3), dsn).save()


def test_non_atomic_write_uses_the_store_insert(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = items(spark, 120)
    writer(frame, dsn, task="resize", keyColumn="id", atomic="false", batchSize="25").save()
    writer(frame, dsn, task="resize", keyColumn="id", atomic="false").save()
    assert sorted(int(j.key) for j in all_jobs(store)) == list(range(120))
    assert leftovers(dsn) == ([], 0)


# --- read ----------------------------------------------------------------------


def _enqueue_each(store: Store, count: int) -> None:
    """Jobs enqueued one at a time: an event each on every store (PostgreSQL counts the
    jobs of one enqueue in one event)."""
    for _ in range(count):
        store.job_insert_many([NewJob("q", "t", "[]", "{}", T0)], T0)


def _history(store: Store) -> None:
    """40 jobs in two queues and two tasks: 10 succeeded, 5 failed, the rest queued."""
    new = [
        NewJob(f"q{i % 2}", f"t{i % 4 // 2}", "[1]", json.dumps({"n": i}), T0, batch=f"b{i % 3}")
        for i in range(40)
    ]
    store.job_insert_many(new, T0)
    claimed = store.job_claim(["q0"], 15, "w1", timedelta(minutes=5), T0 + timedelta(seconds=1))
    done = T0 + timedelta(seconds=10)
    store.job_finish(
        [Finish.complete(j.id, j.lease_token or "", '{"ok":true}') for j in claimed[:10]], done
    )
    store.job_finish(
        [Failure(j.id, j.lease_token or "", "boom", done, retryable=False) for j in claimed[10:]],
        done + timedelta(seconds=5),
    )  # fmt: skip


def test_read_gives_typed_jobs(spark: SparkSession, dsn: str, store: Store) -> None:
    _history(store)
    frame = spark.read.format("conveyor").option("dsn", dsn).option("table", "jobs").load()
    types = dict((f.name, f.dataType) for f in frame.schema.fields)
    assert isinstance(types["id"], LongType) and isinstance(types["attempts"], IntegerType)
    assert isinstance(types["created_at"], TimestampType)
    assert isinstance(types["finished_at"], TimestampType)
    rows = frame.orderBy("id").collect()
    assert len(rows) == 40
    parsed = frame.select(
        F.from_json("kwargs", MapType(StringType(), IntegerType())).alias("k"),
        F.from_json("result", "ok boolean").alias("r"),
    ).collect()
    assert sorted(r.k["n"] for r in parsed) == list(range(40))
    assert sum(1 for r in parsed if r.r is not None and r.r.ok) == 10
    states = {r.state: r["count"] for r in frame.groupBy("state").count().collect()}
    assert states == {"succeeded": 10, "failed": 5, "queued": 25}
    # Compared in Spark: collect() would give naive datetimes in the local zone. Filtered
    # queries come last: Spark 4.3 keeps a loaded DataFrame's first pushed-down plan for its
    # later unfiltered queries (see docs/spark.md), so those run on the DataFrame first.
    assert frame.where(F.col("created_at") == F.lit(T0)).count() == 40
    assert frame.where(F.col("finished_at") == F.lit(T0 + timedelta(seconds=10))).count() == 10
    events = spark.read.format("conveyor").option("dsn", dsn).option("table", "events").load()
    # An enqueued event counts its jobs (one each on SQLite; PostgreSQL writes one per
    # queue and task of an enqueue): 40 either way.
    jobs = F.coalesce(F.col("jobs"), F.lit(1))
    kinds = {r.kind: r["n"] for r in events.groupBy("kind").agg(F.sum(jobs).alias("n")).collect()}
    assert kinds == {"enqueued": 40, "succeeded": 10, "failed": 5}
    # Each attempt's start is on the event that ended it: the 15 that ran.
    assert events.where(F.col("started_at").isNotNull()).count() == 15


def test_filters_are_applied_by_the_database(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    _history(store)
    trace = tmp_path / "trace.jsonl"
    frame = (
        spark.read.format("conveyor")
        .option("dsn", dsn)
        .option("table", "jobs")
        .option("traceFile", str(trace))
        .load()
    )
    since = T0 + timedelta(seconds=9)
    picked = frame.where(
        (F.col("state").isin("succeeded", "failed"))
        & (F.col("queue") == "q0")
        & (F.col("finished_at") >= F.lit(since))
        & (F.col("batch") == "b0")
        & (F.col("task") == "t0")
    ).collect()
    expected = [
        j for j in all_jobs(store)
        if j.state in ("succeeded", "failed") and j.batch == "b0" and j.task == "t0"
    ]  # fmt: skip
    assert sorted(r.id for r in picked) == sorted(j.id for j in expected)
    assert expected
    statements = [json.loads(line) for line in trace.read_text().splitlines()]
    assert statements
    for statement in statements:
        sql = statement["sql"]
        for fragment in ("queue =", "finished_at >=", "batch =", "task ="):
            assert fragment in sql
        assert "state IN (?, ?)" in sql or "state IN (%s, %s)" in sql
    # The database returned only the matching rows, not the table for Spark to filter.
    assert sum(s["rows"] for s in statements) == len(expected)


def test_reads_split_by_id_range_and_read_only_named_columns(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    _history(store)
    trace = tmp_path / "trace.jsonl"
    frame = (
        spark.read.format("conveyor")
        .option("dsn", dsn)
        .option("table", "jobs")
        .option("numPartitions", "3")
        .option("columns", "id,state")
        .option("traceFile", str(trace))
        .load()
    )
    assert frame.columns == ["id", "state"]
    assert frame.rdd.getNumPartitions() == 3
    ids = [r.id for r in frame.collect()]
    assert sorted(ids) == sorted(j.id for j in all_jobs(store))
    statements = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(statements) == 3
    selects = ("SELECT id, state FROM", "COPY (SELECT id, state FROM")
    assert all(s["sql"].startswith(selects) for s in statements)


def test_read_table_helper_filters(spark: SparkSession, dsn: str, store: Store) -> None:
    _history(store)
    failed = read_table(spark, dsn, state="failed", queue="q0").collect()
    assert len(failed) == 5 and {r.error for r in failed} == {"boom"}
    later = read_table(spark, dsn, "events", kind=["succeeded", "failed"],
                       at_since=T0 + timedelta(seconds=12)).collect()  # fmt: skip
    assert {r.kind for r in later} == {"failed"} and len(later) == 5


# --- stream --------------------------------------------------------------------


def _run_stream(
    spark: SparkSession,
    dsn: str,
    out: Path,
    checkpoint: Path,
    available_now: bool | None = None,
    **options: str,
) -> Any:
    """Run a stream to the end of what is there: by Trigger.AvailableNow unless
    ``available_now`` is False (the default with maxEventsPerTrigger), else by
    processAllAvailable on micro-batches."""
    if available_now is None:
        available_now = "maxEventsPerTrigger" not in options
    stream = spark.readStream.format("conveyor").option("dsn", dsn)
    for name, value in options.items():
        stream = stream.option(name, value)
    sink = (
        stream.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        query = sink.trigger(availableNow=True).start()
        query.awaitTermination(120)
        return query
    query = sink.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return query


def _seqs(spark: SparkSession, out: Path) -> list[int]:
    return sorted(r.seq for r in spark.read.parquet(str(out)).select("seq").collect())


def test_stream_resumes_from_its_checkpoint(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _enqueue_each(store, 5)
    query = _run_stream(spark, dsn, out, checkpoint, maxEventsPerTrigger="2")
    assert _seqs(spark, out) == [1, 2, 3, 4, 5]
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [2, 2, 1]  # maxEventsPerTrigger bounds each micro-batch
    # Restarted: only the new events, none twice.
    _enqueue_each(store, 3)
    _run_stream(spark, dsn, out, checkpoint)
    assert _seqs(spark, out) == list(range(1, 9))


def test_available_now_reads_in_batches_of_max_events_and_stops(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _enqueue_each(store, 5)
    query = _run_stream(spark, dsn, out, checkpoint, available_now=True, maxEventsPerTrigger="2")
    assert _seqs(spark, out) == [1, 2, 3, 4, 5]
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [2, 2, 1]


def test_available_now_reads_nothing_written_after_it_started(dsn: str, store: Store) -> None:
    """The reader's side of Trigger.AvailableNow: the target is fixed when Spark prepares it."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from conveyor.spark.stream import EventStreamReader
    from conveyor.spark.tables import TABLES

    _enqueue_each(store, 3)
    reader = EventStreamReader(
        dsn, TABLES["events"], Options({"maxEventsPerTrigger": "2"}, "stream read")
    )
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    _enqueue_each(store, 4)
    first = reader.latestOffset(start, ReadMaxRows(2))
    assert first["seq"] == 2
    second = reader.latestOffset(first, ReadMaxRows(2))
    assert second["seq"] == 3  # the target: the four later events are not read
    assert reader.latestOffset(second, ReadMaxRows(2)) == second
    assert reader.latestOffset(second, ReadAllAvailable()) == second
    # Without Trigger.AvailableNow the same reader moves on to the later events.
    assert (
        EventStreamReader(dsn, TABLES["events"], Options({}, "stream read")).latestOffset(
            second, ReadAllAvailable()
        )["seq"]
        == 7
    )


def test_stream_delivers_an_event_committed_late(
    spark: SparkSession, pg_clean_dsn: str, tmp_path: Path
) -> None:
    store = open_store(pg_clean_dsn)
    store.migrate()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        with event_committed_late(pg_clean_dsn) as (commit_early, early_seq, late_seq):
            # The lower seq is still uncommitted: the stream must not move past it.
            _run_stream(spark, pg_clean_dsn, out, checkpoint)
            assert not out.exists() or _seqs(spark, out) == []
            commit_early()
        _run_stream(spark, pg_clean_dsn, out, checkpoint)
        assert _seqs(spark, out) == [early_seq, late_seq]
        with psycopg.connect(pg_clean_dsn) as more:
            next_seq = more.execute(
                "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
                "VALUES (3, 'q', 't', 'enqueued', 0, now()) RETURNING seq"
            ).fetchone()[0]  # type: ignore[index]
        _run_stream(spark, pg_clean_dsn, out, checkpoint)
        assert _seqs(spark, out) == [early_seq, late_seq, next_seq]
    finally:
        store.close()


def test_a_python_worker_imports_only_the_data_source() -> None:
    # Spark starts a fresh interpreter for each data source plan and gives it about
    # ten seconds to connect back; on a loaded machine every import counts. The
    # data source's modules must not pull in the App, the worker or the dashboard.
    script = (
        "import sys\n"
        "import conveyor.spark.source, conveyor.spark.writer, conveyor.spark.reader\n"
        "import conveyor.spark.stream\n"
        "heavy = ('conveyor.app', 'conveyor.worker', 'conveyor.web', 'conveyor.cli')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
