"""What a DataFrame write enqueues, on both databases: task defaults, arguments, counts, types.

Jobs are checked through the store, and where it matters run by a real worker
(an App on the same database with the same handlers), so that a job the
handler cannot take fails the test.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from conveyor import App
from conveyor.job import JobState
from conveyor.spark import enqueue, write_result
from conveyor.spark.options import Options
from conveyor.spark.rows import WritePlan
from conveyor.spark.writer import ConveyorWriter, WriteConflictError
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from spark_helpers import all_jobs, count_rows, items, leftovers, writer

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (test_spark_options.py).
pytestmark = pytest.mark.sql_only

APP = "tests.spark_app:app"


def finish_all(store: Store, queue: str = "default") -> None:
    """Claim and complete every job of a queue: their keys are free again (unique=live)."""
    now = datetime.now(UTC)
    while claimed := store.job_claim([queue], 100, "w", timedelta(minutes=1), now):
        store.job_finish([Finish.complete(j.id, j.lease_token or "", "null") for j in claimed], now)


# --- task defaults and the handler's arguments -------------------------------------


def test_a_write_takes_the_declared_queue_priority_and_attempts(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([(1, 10), (2, 20)], "image_id long, size int")
    writer(frame, dsn, app=APP, task="resize", keyColumn="image_id").save()
    jobs = sorted(all_jobs(store), key=lambda j: j.key)
    # @app.task(queue="images", max_attempts=1, priority=7), as app.enqueue would.
    assert [(j.queue, j.max_attempts, j.priority) for j in jobs] == [("images", 1, 7)] * 2
    # The key column is also a parameter of resize(image_id, size): the handler gets it.
    assert [j.kwargs for j in jobs] == [{"image_id": 1, "size": 10}, {"image_id": 2, "size": 20}]

    # Options override the declaration.
    writer(
        frame, dsn, app=APP, task="resize", queue="urgent", maxAttempts="4", priority="-2"
    ).save()
    urgent = [j for j in all_jobs(store) if j.queue == "urgent"]
    assert [(j.max_attempts, j.priority) for j in urgent] == [(4, -2)] * 2


def test_the_key_column_reaches_the_handler_and_the_job_runs(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([(i, i + 1) for i in range(4)], "item_id long, x int")
    # square(item_id, x) with keyColumn=item_id, with and without the app option.
    writer(frame, dsn, app=APP, task="square", keyColumn="item_id").save()
    assert sorted(j.kwargs["item_id"] for j in all_jobs(store)) == [0, 1, 2, 3]

    with App(dsn) as local:

        @local.task
        def square(item_id: int, x: int) -> int:
            return x * x

        local.run_worker(burst=True, concurrency=2)
    jobs = all_jobs(store)
    assert {j.state for j in jobs} == {JobState.SUCCEEDED}
    assert sorted(j.result for j in jobs) == [1, 4, 9, 16]


def test_without_the_app_option_named_columns_are_passed_unless_excluded(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([(1, "g", 10)], "image_id long, grp string, size int")
    writer(frame, dsn, task="resize", keyColumn="image_id", groupColumn="grp").save()
    (job,) = all_jobs(store)
    assert job.kwargs == {"size": 10, "image_id": 1, "grp": "g"}
    assert (job.key, job.group) == ("1", "g")
    writer(
        frame, dsn, task="resize", keyColumn="image_id", groupColumn="grp",
        excludeColumns="image_id, grp", queue="q2",
    ).save()  # fmt: skip
    (other,) = [j for j in all_jobs(store) if j.queue == "q2"]
    assert other.kwargs == {"size": 10} and (other.key, other.group) == ("1", "g")


def test_columns_the_handler_cannot_take_are_refused_before_anything_is_written(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([(1, 10, "x")], "image_id long, size int, colour string")
    with pytest.raises(AnalysisException, match=r"colour are not parameters of task resize"):
        writer(frame, dsn, app=APP, task="resize").save()
    with pytest.raises(AnalysisException, match="missing a required argument: 'size'"):
        writer(frame.select("image_id"), dsn, app=APP, task="resize").save()
    with pytest.raises(AnalysisException, match="'nope' is not registered in app"):
        writer(frame, dsn, app=APP, task="nope").save()
    with pytest.raises(AnalysisException, match="cannot import 'no_such_module'"):
        writer(frame, dsn, app="no_such_module:app", task="resize").save()
    # Names that are not identifiers could never be keyword arguments.
    odd = spark.range(3).selectExpr("id", "id * 5")
    with pytest.raises(AnalysisException, match=r"'\(id \* 5\)' cannot be keyword arguments"):
        writer(odd, dsn, task="t").save()
    # With kwargsColumn, other columns would be dropped: refused, never silent.
    payload = spark.createDataFrame([(1, {"a": 1})], "id long, payload map<string,int>")
    with pytest.raises(AnalysisException, match=r"column\(s\) id would be dropped"):
        writer(payload, dsn, task="t", kwargsColumn="payload").save()
    assert all_jobs(store) == []
    assert leftovers(dsn) == ([], 0)
    writer(payload, dsn, task="t", kwargsColumn="payload", excludeColumns="id").save()
    writer(odd, dsn, task="t", excludeColumns="(id * 5)").save()
    assert len(all_jobs(store)) == 4


def test_task_column_with_the_app_takes_each_tasks_declaration(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame(
        [("add", 1, 2), ("add", 3, None), ("notify", None, None)], "task string, a int, b int"
    )
    with pytest.raises(Exception, match="the arguments do not fit task notify"):
        writer(frame, dsn, app=APP, taskColumn="task").save()
    assert all_jobs(store) == []
    adds = frame.where("task = 'add'")
    writer(adds, dsn, app=APP, taskColumn="task").save()
    # By a: the partitions' jobs may be committed in parallel pieces, their ids interleaved.
    jobs = sorted(all_jobs(store), key=lambda j: j.kwargs["a"])
    assert [(j.task, j.queue, j.max_attempts) for j in jobs] == [("add", "default", 3)] * 2
    assert [j.kwargs for j in jobs] == [{"a": 1, "b": 2}, {"a": 3, "b": None}]
    unknown = spark.createDataFrame([("ghost", 1, 1)], "task string, a int, b int")
    with pytest.raises(Exception, match="task 'ghost' is not registered in the app"):
        writer(unknown, dsn, app=APP, taskColumn="task").save()


def test_args_column_with_other_columns_as_keyword_arguments(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.createDataFrame([([1], 2), ([3], None)], "args array<int>, b int")
    writer(frame, dsn, app=APP, task="add", argsColumn="args").save()
    jobs = sorted(all_jobs(store), key=lambda j: j.args)
    assert [(j.args, j.kwargs) for j in jobs] == [([1], {"b": 2}), ([3], {"b": None})]
    # add(a, b=0) called with two positional arguments and b: refused, naming the row.
    clash = spark.createDataFrame([([1], 1), ([1, 2], 3)], "args array<int>, b int").coalesce(1)
    with pytest.raises(Exception, match=r"row 1 of partition 0.*multiple values for argument 'b'"):
        writer(clash, dsn, app=APP, task="add", argsColumn="args").save()
    assert len(all_jobs(store)) == 2


# --- counts and reruns ---------------------------------------------------------------


def test_every_write_reports_what_it_enqueued_and_skipped(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = items(spark, 30)
    first = enqueue(frame, dsn, task="resize", keyColumn="id")
    assert (first.rows, first.enqueued, first.skipped, first.new) == (30, 30, 0, True)
    # The same rows again while their jobs are live: every one a duplicate.
    again = enqueue(frame, dsn, task="resize", keyColumn="id")
    assert (again.rows, again.enqueued, again.skipped) == (30, 0, 30)
    assert write_result(dsn, again.id) == again
    # A key is free again once its job finished (unique="live") ...
    finish_all(store)
    after = enqueue(frame, dsn, task="resize", keyColumn="id")
    assert (after.enqueued, after.skipped) == (30, 0)
    # ... unless unique="forever": any job that held it, until purged.
    finish_all(store)
    forever = enqueue(frame, dsn, task="resize", keyColumn="id", unique="forever")
    assert (forever.enqueued, forever.skipped) == (0, 30)
    # Keys are per queue, whatever the task: another queue takes the same keys.
    other = enqueue(frame, dsn, task="thumbnail", keyColumn="id", queue="thumbs")
    assert other.enqueued == 30
    assert len(all_jobs(store)) == 90


def test_a_rerun_under_the_same_write_id_enqueues_nothing(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = items(spark, 12)
    # A run whose driver died after it opened the write: it holds nothing up.
    schema = StructType([StructField("id", LongType())])
    options = Options({"task": "resize", "writeid": "daily-2026-11-23"}, "write")
    dead = ConveyorWriter(dsn, WritePlan.from_options(schema, options))
    # No key column: only the write id tells a rerun apart.
    daily = enqueue(frame, dsn, task="resize", writeId="daily-2026-11-23")
    assert (daily.id, daily.enqueued, daily.new) == ("daily-2026-11-23", 12, True)
    finish_all(store)
    rerun = enqueue(frame, dsn, task="resize", writeId="daily-2026-11-23")
    assert (rerun.enqueued, rerun.new) == (12, False)  # the first run's result
    writer(frame, dsn, task="resize", writeId="daily-2026-11-23", atomic="false").save()
    assert len(all_jobs(store)) == 12
    assert enqueue(frame, dsn, task="resize", writeId="daily-2026-11-24").enqueued == 12
    assert len(all_jobs(store)) == 24
    # Had the first run lived to commit, it would have found the day done.
    dead.commit([dead.write(iter([pa.RecordBatch.from_pydict({"id": [99]})]))])
    assert len(all_jobs(store)) == 24
    assert leftovers(dsn) == ([], 0)


def test_the_daily_pipeline_idiom_is_idempotent(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    """The Spark guide's idiom (docs/spark.md): a key of the day and the item, kept forever."""
    frame = items(spark, 10).withColumn("job_key", F.concat(F.lit("2026-11-23:"), F.col("id")))
    options = {"task": "resize", "keyColumn": "job_key", "unique": "forever"}
    assert enqueue(frame, dsn, excludeColumns="job_key", **options).enqueued == 10
    finish_all(store)  # the jobs ran; the day is rerun anyway
    assert enqueue(frame, dsn, excludeColumns="job_key", **options).enqueued == 0
    assert len(all_jobs(store)) == 10


def test_the_counts_reach_the_driver_log(
    dsn: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    schema = StructType([StructField("id", LongType()), StructField("path", StringType())])
    plan = WritePlan.from_options(schema, Options({"task": "t", "keycolumn": "id"}, "write"))
    batch = pa.RecordBatch.from_pydict({"id": [1, 2, 2], "path": ["a", "b", "b"]})
    write = ConveyorWriter(dsn, plan)
    with caplog.at_level(logging.INFO, logger="conveyor.spark"):
        write.commit([write.write(iter([batch]))])
    # Once, with the way it committed (SQLite and a stock PostgreSQL: one transaction).
    line = f"conveyor write {write.write_id} committed in one transaction: 3 rows: 2 jobs enqueued"
    assert caplog.text.count(line) == 1
    assert caplog.text.count("committed in") == 1
    assert len(all_jobs(store)) == 2


def test_the_driver_log_line_is_shown_where_nothing_configured_logging() -> None:
    """Spark's Python process on the driver configures no logging: the line must still show."""
    import subprocess
    import sys

    code = (
        "from conveyor.spark.writer import driver_log; "
        "driver_log().info('conveyor write w1: 3 rows: 3 jobs enqueued')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "INFO conveyor.spark: conveyor write w1: 3 rows: 3 jobs enqueued" in done.stderr


# --- types -----------------------------------------------------------------------


def test_maps_decimals_and_times_become_json_without_losing_anything(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = spark.sql(
        """
        SELECT 1 AS id,
               map() :: map<string,int> AS empty,
               map('a', 1) AS filled,
               array(map('k', 2), map()) AS nested,
               CAST('12345678901234567890.123456789012345678' AS decimal(38,18)) AS amount,
               CAST(0 AS decimal(12,4)) AS zero,
               named_struct('price', CAST(9.90 AS decimal(5,2))) AS item,
               DATE'2026-11-23' AS day
        """
    )
    writer(frame, dsn, task="bill").save()
    (job,) = all_jobs(store)
    assert job.kwargs["empty"] == {}  # an empty map is an object, not a list
    assert job.kwargs["filled"] == {"a": 1}
    assert job.kwargs["nested"] == [{"k": 2}, {}]
    # Decimals are strings of their exact digits: Decimal(value) gives them back.
    assert job.kwargs["amount"] == "12345678901234567890.123456789012345678"
    assert Decimal(job.kwargs["amount"]) == Decimal("12345678901234567890.123456789012345678")
    assert job.kwargs["zero"] == "0.0000"
    assert job.kwargs["item"] == {"price": "9.90"}
    assert job.kwargs["day"] == "2026-11-23"


# --- non-atomic writes and task retries --------------------------------------------


def test_a_retried_task_of_a_non_atomic_write_enqueues_no_row_twice(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    @F.udf(returnType=LongType(), useArrow=False)
    def fail_first_attempt(value: int) -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        # The first attempt of partition 1 dies after three batches of 50 committed.
        if value == 370 and context is not None and context.attemptNumber() == 0:
            raise RuntimeError("injected task failure")
        return value

    # No key column: nothing but the write's own progress keeps rows from repeating.
    frame = items(spark, 400).withColumn("id", fail_first_attempt("id"))
    result = enqueue(frame, dsn, task="resize", atomic="false", batchSize="50")
    assert sorted(j.kwargs["id"] for j in all_jobs(store)) == list(range(400))
    assert (result.rows, result.enqueued, result.skipped) == (400, 400, 0)
    assert count_rows(dsn, "SELECT count(*) FROM spark_write_progress") == 0
    assert leftovers(dsn) == ([], 0)


def test_a_retry_given_its_rows_in_another_order_stops_rather_than_repeat(
    dsn: str, store: Store
) -> None:
    schema = StructType([StructField("id", LongType())])
    options = Options({"task": "t", "atomic": "false", "batchsize": "2"}, "write")
    write = ConveyorWriter(dsn, WritePlan.from_options(schema, options))

    def batches(ids: list[int], fail_after: int | None = None) -> Any:
        for start in range(0, len(ids), 2):
            if fail_after is not None and start >= fail_after:
                raise RuntimeError("task lost")
            yield pa.RecordBatch.from_pydict({"id": ids[start : start + 2]})

    with pytest.raises(RuntimeError, match="task lost"):
        write.write(batches([1, 2, 3, 4, 5, 6], fail_after=4))
    assert len(all_jobs(store)) == 4
    with pytest.raises(WriteConflictError, match="other rows first"):
        write.write(batches([6, 5, 4, 3, 2, 1]))
    assert len(all_jobs(store)) == 4
    # The same order: the retry enqueues the two rows the failed attempt did not.
    write.commit([write.write(batches([1, 2, 3, 4, 5, 6]))])
    assert sorted(j.kwargs["id"] for j in all_jobs(store)) == [1, 2, 3, 4, 5, 6]
    assert write_result(dsn, write.write_id).enqueued == 6  # type: ignore[union-attr]


# --- Spark SQL ---------------------------------------------------------------------


def test_sql_tables_read_jobs_and_enqueue(spark: SparkSession, dsn: str, store: Store) -> None:
    name = f"t{abs(hash(dsn)) % 10**8}"
    spark.sql(f"DROP TABLE IF EXISTS {name}_jobs")
    spark.sql(f"DROP TABLE IF EXISTS {name}_resize")
    spark.sql(f"CREATE TABLE {name}_jobs USING conveyor OPTIONS (dsn '{dsn}', table 'jobs')")
    spark.sql(
        f"CREATE TABLE {name}_resize USING conveyor OPTIONS (dsn '{dsn}', task 'resize', "
        f"keyColumn 'image_id', app '{APP}', schema 'image_id BIGINT, size INT')"
    )
    try:
        spark.sql(f"INSERT INTO {name}_resize VALUES (1, 10), (2, 20)")
        spark.sql(f"INSERT INTO {name}_resize SELECT id, 5 FROM range(1, 4)")  # 1, 2: duplicates
        rows = spark.sql(f"SELECT key, queue, kwargs FROM {name}_jobs ORDER BY key").collect()
        assert [(r.key, r.queue) for r in rows] == [
            ("1", "images"),
            ("2", "images"),
            ("3", "images"),
        ]
        assert spark.sql(f"SELECT count(*) FROM {name}_jobs WHERE state = 'queued'").first()[0] == 3
        with pytest.raises(AnalysisException, match="this conveyor table enqueues jobs"):
            spark.sql(f"SELECT * FROM {name}_resize").collect()
        with pytest.raises(AnalysisException, match="this conveyor table reads jobs or events"):
            spark.sql(f"INSERT INTO {name}_jobs SELECT * FROM {name}_jobs").collect()
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}_jobs")
        spark.sql(f"DROP TABLE IF EXISTS {name}_resize")
    # A temporary view takes its options directly, for reads and writes.
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW {name}_mail (user STRING) USING conveyor "
        f"OPTIONS (dsn '{dsn}', task 'notify', app '{APP}')"
    )
    spark.sql(f"INSERT INTO {name}_mail VALUES ('ann')")
    mail = [j for j in all_jobs(store) if j.task == "notify"]
    assert [(j.queue, j.max_attempts, j.kwargs) for j in mail] == [("mail", 5, {"user": "ann"})]


def test_every_documented_insert_into_a_sql_table_enqueues(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    name = f"i{abs(hash(dsn)) % 10**8}"
    spark.sql(f"DROP TABLE IF EXISTS {name}")
    spark.sql(
        f"CREATE TABLE {name} USING conveyor OPTIONS (dsn '{dsn}', task 'resize', "
        f"keyColumn 'image_id', schema 'image_id BIGINT, size INT')"
    )
    # A source whose column names and types are the table's: Spark adds no cast or
    # alias of its own here (the case that used to lose the table's options).
    spark.createDataFrame(
        [(k, k * 10) for k in (1, 2, 3)], "image_id bigint, size int"
    ).createOrReplaceTempView(f"{name}_images")
    try:
        spark.sql(f"INSERT INTO {name} SELECT image_id, size FROM {name}_images WHERE size < 30")
        spark.sql(f"INSERT INTO {name} SELECT * FROM {name}_images WHERE image_id = 3")
        spark.sql(f"INSERT INTO {name} BY NAME SELECT 40 AS size, 4L AS image_id")
        spark.sql(f"INSERT INTO {name} VALUES (5, 50)")
        spark.sql(f"INSERT INTO {name} (size, image_id) VALUES (60, 6)")
        # Spark shows the names in disguise; the handler gets them as the option gave them.
        assert spark.table(name).schema.names == ["iMaGe_Id", "sIzE"]
    finally:
        spark.sql(f"DROP TABLE IF EXISTS {name}")
    jobs = sorted(all_jobs(store), key=lambda j: int(j.key or 0))
    assert [(j.task, j.key, j.kwargs) for j in jobs] == [
        ("resize", str(k), {"image_id": k, "size": k * 10}) for k in range(1, 7)
    ]
    assert leftovers(dsn) == ([], 0)


def test_create_table_as_select_says_what_to_write_instead(
    spark: SparkSession, sqlite_store: tuple[str, Store]
) -> None:
    # Spark hands a Python data source none of the OPTIONS of CREATE TABLE ... AS
    # SELECT: the write fails before anything is enqueued, saying what works.
    dsn, store = sqlite_store
    spark.sql("DROP TABLE IF EXISTS ctas_resize")
    try:
        with pytest.raises(AnalysisException, match=r"and no AS SELECT.*INSERT INTO it"):
            spark.sql(
                f"CREATE TABLE ctas_resize USING conveyor OPTIONS (dsn '{dsn}', task 'resize') "
                "AS SELECT 1L AS image_id, 10 AS size"
            )
    finally:
        spark.sql("DROP TABLE IF EXISTS ctas_resize")
    assert all_jobs(store) == []


def test_a_sql_table_with_a_column_list_says_how_to_define_it(
    spark: SparkSession, sqlite_store: tuple[str, Store]
) -> None:
    dsn, store = sqlite_store
    spark.sql("DROP TABLE IF EXISTS listed_columns")
    spark.sql(
        f"CREATE TABLE listed_columns (image_id BIGINT) USING conveyor "
        f"OPTIONS (dsn '{dsn}', task 'resize')"
    )
    try:
        with pytest.raises(AnalysisException, match=r"OPTIONS \(schema '...'\)"):
            spark.sql("INSERT INTO listed_columns VALUES (1)")
    finally:
        spark.sql("DROP TABLE IF EXISTS listed_columns")
    assert all_jobs(store) == []
