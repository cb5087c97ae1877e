"""The write contract a data engineer relies on, on both databases (docs/spark.md).

Null keys follow one rule, a database without conveyor's tables is refused,
and the result says how the write committed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.utils import CapturedException

from conveyor.spark import enqueue, write_result
from conveyor.store.protocols import Store
from spark_helpers import all_jobs, leftovers, spark_tables, writer

pytestmark = pytest.mark.sql_only

#: What a failed write raises in the driver: Spark's wrapping of the data source's error.
SparkFailure = (PySparkException, CapturedException)


def _with_null_keys(spark: SparkSession) -> object:
    """Ten rows over two partitions; three of them have a null key."""
    return spark.range(0, 10, numPartitions=2).selectExpr(
        "id", "CASE WHEN id IN (1, 5, 8) THEN NULL ELSE concat('k', id) END AS job_key"
    )


def test_rows_with_a_null_key_are_refused_with_their_count_and_nothing_is_enqueued(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = _with_null_keys(spark)
    with pytest.raises(SparkFailure) as failed:
        enqueue(frame, dsn, task="resize", keyColumn="job_key")  # type: ignore[arg-type]
    text = str(failed.value)
    assert "3 rows of the write have a null key column 'job_key'" in text
    assert 'nullKeys "keyless"' in text
    assert all_jobs(store) == []
    assert leftovers(dsn) == ([], 0)


def test_a_non_atomic_write_refuses_a_batch_with_null_keys(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = _with_null_keys(spark).coalesce(1)
    with pytest.raises(SparkFailure, match="have a null key column 'job_key'"):
        enqueue(frame, dsn, task="resize", keyColumn="job_key", atomic=False)  # type: ignore[arg-type]
    assert all_jobs(store) == []


def test_null_keys_enqueue_keyless_only_when_asked_and_are_counted(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = _with_null_keys(spark)
    options = {"task": "resize", "keyColumn": "job_key", "unique": "forever", "nullKeys": "keyless"}
    first = enqueue(frame, dsn, **options)  # type: ignore[arg-type]
    assert (first.rows, first.enqueued, first.skipped, first.keyless) == (10, 10, 0, 3)
    assert sorted(j.key is None for j in all_jobs(store)).count(True) == 3
    # A rerun: every keyed row is a duplicate, the keyless ones are enqueued again (and say so).
    again = enqueue(frame, dsn, **options)  # type: ignore[arg-type]
    assert (again.rows, again.enqueued, again.skipped, again.keyless) == (10, 3, 7, 3)
    assert write_result(dsn, again.id) == again
    per_partition = enqueue(frame, dsn, atomic=False, **options)  # type: ignore[arg-type]
    assert (per_partition.enqueued, per_partition.keyless) == (3, 3)


def test_an_empty_key_is_refused_whatever_nullkeys_says(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([(1, "a"), (2, "")], "id long, job_key string")
    with pytest.raises(SparkFailure, match="key"):
        enqueue(frame, dsn, task="resize", keyColumn="job_key", nullKeys="keyless")
    assert all_jobs(store) == []


def test_a_database_without_conveyor_tables_is_refused_and_left_as_it_was(
    spark: SparkSession, dsn: str
) -> None:
    frame = spark.range(0, 4, numPartitions=2)
    with pytest.raises(SparkFailure) as failed:
        enqueue(frame, dsn, task="resize")
    text = str(failed.value)
    database = dsn.rsplit("/", 1)[-1]
    assert database in text
    assert "has no conveyor tables" in text
    assert "run `conveyor migrate`" in text
    assert spark_tables(dsn) == []


def test_create_tables_makes_them_when_asked(spark: SparkSession, dsn: str) -> None:
    frame = spark.range(0, 4, numPartitions=2)
    result = enqueue(frame, dsn, task="resize", createTables=True)
    assert result.enqueued == 4
    assert "spark_writes" in spark_tables(dsn)


def test_the_result_says_how_the_write_committed(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.range(0, 6, numPartitions=2)
    # max_prepared_transactions is 0 on a stock server (and SQLite has one writer):
    # an atomic write commits in one transaction unless parallel pieces are possible.
    atomic = enqueue(frame, dsn, task="resize", commitPieces=1)
    assert atomic.path == "one transaction"
    per_partition = enqueue(frame, dsn, task="resize", atomic=False)
    assert per_partition.path == "per partition"
    assert write_result(dsn, per_partition.id) == per_partition


def test_writes_from_other_python_threads_find_the_data_source(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    """PySpark's active session is per thread: a pipeline's worker threads write too."""
    import threading

    from conveyor.spark import activate

    outcomes: list[object] = []

    def in_a_thread(write: Callable[[], object]) -> None:
        def run() -> None:
            try:
                outcomes.append(write())
            except Exception as exc:  # compared below: the thread's error shows there
                outcomes.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()

    in_a_thread(lambda: enqueue(spark.range(0, 4, numPartitions=2), dsn, task="resize").enqueued)

    def direct() -> str:
        activate(spark)  # df.write in a thread of one's own: activate first
        writer(spark.range(0, 2), dsn, task="resize").save()
        return "saved"

    in_a_thread(direct)
    assert outcomes == [4, "saved"]
    assert len(all_jobs(store)) == 6


def test_a_table_made_by_save_as_table_is_written_again_and_says_what_it_lacks(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.range(0, 3)
    name = f"made_{abs(hash(dsn)) % 10**8}"
    save = writer(frame, dsn, task="resize")
    save.saveAsTable(name)
    save.saveAsTable(name)  # again, with its options: enqueues again
    assert len(all_jobs(store)) == 6
    with pytest.raises(SparkFailure, match=r"saveAsTable\(...\) or df.writeTo"):
        frame.write.insertInto(name)
    assert len(all_jobs(store)) == 6
    spark.sql(f"DROP TABLE {name}")
