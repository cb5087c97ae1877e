"""Streams on both databases: the streaming sink, where an event stream starts, bounded reads.

The sink's crash test removes the last entry of the checkpoint's commit log,
which is exactly what a driver killed between the sink's commit and Spark's
own leaves behind: Spark then runs that micro-batch again on restart.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from conveyor.job import NewJob
from conveyor.spark import write_result
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from spark_helpers import all_jobs, leftovers
from store_fixtures import event_committed_late

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (test_spark_options.py).
pytestmark = pytest.mark.sql_only

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sink(spark: Any, dsn: str, source: Path, checkpoint: Path, **options: str) -> Any:
    """Run a stream of the Parquet files in ``source`` into conveyor, to the end of them."""
    stream = (
        spark.readStream.schema("id long, x long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(source))
        .writeStream.format("conveyor")
        .option("dsn", dsn)
        .option("checkpointLocation", str(checkpoint))
    )
    for name, value in options.items():
        stream = stream.option(name, value)
    query = stream.trigger(availableNow=True).start()
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return query


def parquet_file(folder: Path, name: str, ids: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(ids), "x": [i * 2 for i in ids]})
    pq.write_table(table, folder / f"{name}.parquet")


def sink_runs_exactly_once(spark: Any, dsn: str, store: Store, tmp_path: Path) -> None:
    """The sink's contract, for the classic session and Spark Connect alike."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    parquet_file(source, "a", range(0, 6))
    first = sink(spark, dsn, source, checkpoint, task="resize")
    # No key column: only the recorded micro-batch keeps a replay from repeating jobs.
    assert sorted(j.kwargs["id"] for j in all_jobs(store)) == list(range(6))
    recorded = write_result(dsn, f"stream:{first.id}")
    assert recorded is not None
    assert (recorded.batch, recorded.rows, recorded.enqueued) == (0, 6, 6)

    # The driver died after the sink committed batch 0 and before Spark did.
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)  # the local file system's checksum
    again = sink(spark, dsn, source, checkpoint, task="resize")
    assert again.id == first.id
    assert len(all_jobs(store)) == 6  # batch 0 ran again and enqueued nothing

    parquet_file(source, "b", range(6, 10))
    sink(spark, dsn, source, checkpoint, task="resize")
    assert sorted(j.kwargs["id"] for j in all_jobs(store)) == list(range(10))
    total = write_result(dsn, f"stream:{first.id}")
    assert total is not None and (total.batch, total.rows, total.enqueued) == (1, 10, 10)
    assert leftovers(dsn) == ([], 0)


def test_streaming_sink_enqueues_each_micro_batch_once_across_restarts(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    sink_runs_exactly_once(spark, dsn, store, tmp_path)


def test_streaming_sink_takes_task_defaults_and_refuses_batch_only_options(
    spark: SparkSession, sqlite_store: tuple[str, Store], tmp_path: Path
) -> None:
    dsn, store = sqlite_store
    source = tmp_path / "in"
    parquet_file(source, "a", range(3))
    with pytest.raises(Exception, match='"atomic" does not apply to a conveyor streaming sink'):
        sink(spark, dsn, source, tmp_path / "c1", task="t", atomic="false")
    with pytest.raises(Exception, match="x are not parameters of task resize"):
        sink(spark, dsn, source, tmp_path / "c2", app="tests.spark_app:app", task="resize")
    query = (
        spark.readStream.schema("id long, x long")
        .parquet(str(source))
        .selectExpr("id AS image_id", "cast(x AS int) AS size")
        .writeStream.format("conveyor")
        .option("dsn", dsn)
        .option("app", "tests.spark_app:app")
        .option("task", "resize")
        .option("checkpointLocation", str(tmp_path / "c3"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    jobs = sorted(all_jobs(store), key=lambda j: j.kwargs["image_id"])
    # resize is declared with queue="images", max_attempts=1, priority=7.
    assert [(j.queue, j.max_attempts, j.priority) for j in jobs] == [("images", 1, 7)] * 3
    assert [j.kwargs for j in jobs] == [{"image_id": i, "size": 2 * i} for i in range(3)]


# --- where an event stream starts ----------------------------------------------------


def run_stream(spark: Any, dsn: str, out: Path, checkpoint: Path, **options: str) -> list[int]:
    """Stream the events into Parquet until there are no more; return every seq written so far."""
    stream = spark.readStream.format("conveyor").option("dsn", dsn)
    for name, value in options.items():
        stream = stream.option(name, value)
    query = (
        stream.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    if not out.exists() or not any(out.glob("*.parquet")):
        return []
    return sorted(r.seq for r in spark.read.parquet(str(out)).select("seq").collect())


def enqueue_each(store: Store, count: int, at: datetime) -> None:
    """Jobs enqueued one at a time: an event each on every store (PostgreSQL counts the
    jobs of one enqueue in one event)."""
    for _ in range(count):
        store.job_insert_many([NewJob("q", "t", "[]", "{}", at)], at)


def two_hours_of_events(store: Store) -> None:
    """Events 1-5 recorded at T0, 6-8 an hour later."""
    enqueue_each(store, 5, T0)
    enqueue_each(store, 3, T0 + timedelta(hours=1))


def test_a_stream_starts_at_a_seq_a_time_or_the_end(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    two_hours_of_events(store)

    def fresh(name: str, **options: str) -> list[int]:
        return run_stream(spark, dsn, tmp_path / name, tmp_path / f"{name}.ckpt", **options)

    assert fresh("from3", startingOffsets="3") == list(range(3, 9))
    half_hour = T0 + timedelta(minutes=30)
    millis = str(int(half_hour.timestamp() * 1000))
    assert fresh("ms", startingTimestamp=millis) == [6, 7, 8]
    # Nothing since then yet: the stream starts at the end and takes what comes.
    future = str(int((T0 + timedelta(days=1)).timestamp() * 1000))
    assert fresh("future", startingTimestamp=future) == []
    assert fresh("latest", startingOffsets="latest") == []
    enqueue_each(store, 2, T0)
    assert fresh("latest", startingOffsets="latest") == [9, 10]
    assert fresh("future", startingTimestamp=future) == [9, 10]
    # A restart follows its checkpoint, not the start options.
    assert fresh("from3", startingOffsets="3") == list(range(3, 11))
    with pytest.raises(Exception, match="startingOffsets must be"):
        fresh("bad", startingOffsets="soon")
    with pytest.raises(Exception, match="startingOffsets or startingTimestamp, not both"):
        fresh("both", startingOffsets="1", startingTimestamp=millis)


def test_a_stream_from_a_seq_never_hands_out_a_lower_seq_committed_late(
    spark: SparkSession, pg_clean_dsn: str, tmp_path: Path
) -> None:
    store = open_store(pg_clean_dsn)
    store.migrate()
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    try:
        with event_committed_late(pg_clean_dsn) as (commit_early, early_seq, late_seq):
            # Starting at the later event. While the earlier one's transaction is open,
            # the stream waits for it (it cannot know yet where that event falls) ...
            start = str(late_seq)
            assert run_stream(spark, pg_clean_dsn, out, checkpoint, startingOffsets=start) == []
            commit_early()
        # ... and once it commits, leaves it out: it is below the start.
        assert early_seq < late_seq
        assert run_stream(spark, pg_clean_dsn, out, checkpoint) == [late_seq]
    finally:
        store.close()


def test_a_batch_read_of_events_between_offsets(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    two_hours_of_events(store)

    def seqs(**options: str) -> list[int]:
        reader = spark.read.format("conveyor").option("dsn", dsn).option("table", "events")
        for name, value in options.items():
            reader = reader.option(name, value)
        return sorted(r.seq for r in reader.load().select("seq").collect())

    assert seqs(startingOffsets="3", endingOffsets="6") == [3, 4, 5]
    assert seqs(endingOffsets="3") == [1, 2]
    assert seqs(startingOffsets="7") == [7, 8]
    assert seqs(startingOffsets="earliest", endingOffsets="latest") == list(range(1, 9))
    assert seqs(startingOffsets="20") == []
    with pytest.raises(AnalysisException, match='cannot start at "latest"'):
        seqs(startingOffsets="latest")
    with pytest.raises(AnalysisException, match="apply to the events table"):
        spark.read.format("conveyor").option("dsn", dsn).option("table", "jobs").option(
            "endingOffsets", "3"
        ).load().collect()


def test_a_user_schema_with_nullable_columns_reads(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    two_hours_of_events(store)
    frame = (
        spark.read.format("conveyor")
        .schema("id long, state string, finished_at timestamp, created_at timestamp")
        .option("dsn", dsn)
        .option("table", "jobs")
        .load()
    )
    rows = frame.collect()
    assert len(rows) == 8 and {r.state for r in rows} == {"queued"}
    assert all(r.finished_at is None for r in rows)
    strict = (
        spark.read.format("conveyor")
        .schema("id long NOT NULL, finished_at timestamp NOT NULL")
        .option("dsn", dsn)
        .option("table", "jobs")
        .load()
    )
    with pytest.raises(AnalysisException, match="finished_at of jobs can be null"):
        strict.collect()
