"""Options of the ``conveyor`` data source: every one checked, before anything is read or written.

The rules are checked on ``Options`` directly (no Spark needed), then through
Spark on both databases: a refused write leaves the store untouched.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from conveyor.errors import ConfigurationError
from conveyor.spark.options import Options, ddl_with_options, names_for
from conveyor.store.protocols import Store
from spark_helpers import all_jobs, items, leftovers, spark_tables, writer

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (the last test here).
pytestmark = pytest.mark.sql_only


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("key", "keyColumn"),  # the Python API's name of the option
        ("keyColum", "keyColumn"),
        ("queu", "queue"),
        ("atomc", "atomic"),
        ("maxAttempt", "maxAttempts"),
        ("max_attempts", "maxAttempts"),
        ("uniqe", "unique"),
        ("group", "groupColumn"),
    ],
)
def test_an_unknown_write_option_names_the_closest(typed: str, meant: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Options({"dsn": "sqlite:///x.db", typed: "id"}, "write")
    message = str(caught.value)
    # Quoted as typed (what conveyor.spark.enqueue passes; PySpark's .option() lowercases).
    assert f'unknown option "{typed}" for a conveyor write' in message
    assert f'Did you mean "{meant}"?' in message
    # And the rest of the set, so the user sees what there is.
    for name in ("dsn", "task", "keyColumn", "atomic", "writeId", "excludeColumns"):
        assert name in message


@pytest.mark.parametrize(
    ("use", "typed", "meant"),
    [
        ("read", "tabel", "table"),
        ("read", "numPartition", "numPartitions"),
        ("stream read", "maxEventsPerTriger", "maxEventsPerTrigger"),
        ("stream read", "maxOffsetsPerTrigger", "maxEventsPerTrigger"),  # Kafka's name
        ("stream read", "startingOffset", "startingOffsets"),
    ],
)
def test_an_unknown_read_option_names_the_closest(use: str, typed: str, meant: str) -> None:
    with pytest.raises(ConfigurationError, match=f'Did you mean "{meant}"'):
        Options({"dsn": "sqlite:///x.db", typed.lower(): "1"}, use)  # type: ignore[arg-type]


def test_an_option_of_another_use_says_where_it_belongs() -> None:
    with pytest.raises(ConfigurationError, match=r"not apply to a conveyor read .*stream read"):
        Options({"maxeventspertrigger": "5"}, "read")
    with pytest.raises(ConfigurationError, match='"atomic" does not apply to a conveyor streaming'):
        Options({"atomic": "false"}, "stream write")


def test_options_are_case_insensitive_and_spark_catalog_keys_are_ignored() -> None:
    options = Options({"KEYCOLUMN": "id", "Task": "t", "provider": "conveyor"}, "write")
    assert options.text("keyColumn") == "id" and options.text("task") == "t"


def test_values_are_checked_naming_the_option() -> None:
    write = Options(
        {"maxattempts": "abc", "atomic": "maybe", "unique": "always", "batchsize": "0"}, "write"
    )
    with pytest.raises(
        ConfigurationError, match="option maxAttempts must be an integer, got 'abc'"
    ):
        write.integer("maxAttempts", None)
    with pytest.raises(ConfigurationError, match="option atomic must be true or false"):
        write.boolean("atomic", True)
    with pytest.raises(ConfigurationError, match='option unique must be "live" or "forever"'):
        write.choice("unique", ("live", "forever"), "live")
    with pytest.raises(ConfigurationError, match="option batchSize must be at least 1"):
        write.integer("batchSize", 10)
    stream = Options({"startingtimestamp": "yesterday"}, "stream read")
    with pytest.raises(ConfigurationError, match="startingTimestamp must be milliseconds"):
        stream.timestamp("startingTimestamp")


def test_a_starting_timestamp_is_milliseconds_or_iso_8601_with_a_zone() -> None:
    from datetime import UTC, datetime

    moment = datetime(2026, 1, 1, 0, 30, tzinfo=UTC)
    for text in ("1767227400000", "2026-01-01T00:30:00+00:00", "2026-01-01T01:30:00+01:00"):
        options = Options({"startingtimestamp": text}, "stream read")
        assert options.timestamp("startingTimestamp") == moment
    with pytest.raises(ConfigurationError, match="with a zone"):
        Options({"startingtimestamp": "2026-01-01T00:30:00"}, "stream read").timestamp(
            "startingTimestamp"
        )


def test_every_documented_option_is_in_the_spark_guide() -> None:
    from pathlib import Path

    guide = (Path(__file__).parent.parent / "docs" / "spark.md").read_text()
    for use in ("read", "stream read", "write", "stream write"):
        for name in names_for(use):  # type: ignore[arg-type]
            if name != "checkpointLocation":
                assert f"`{name}`" in guide, name


# --- through Spark, on both databases --------------------------------------------


def test_misspelt_write_options_fail_before_anything_is_written(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    frame = items(spark, 5)
    for typed, meant in (("key", "keyColumn"), ("keyColum", "keyColumn"), ("atomc", "atomic")):
        with pytest.raises(AnalysisException, match=f'Did you mean "{meant}"'):
            writer(frame, dsn, task="resize", **{typed: "id"}).save()
    with pytest.raises(AnalysisException, match="option maxAttempts must be an integer"):
        writer(frame, dsn, task="resize", maxAttempts="abc").save()
    with pytest.raises(AnalysisException, match="option batchSize must be at least 1"):
        writer(frame, dsn, task="resize", batchSize="0").save()
    # Nothing reached the store: no job, no write opened, nothing staged, not
    # even Spark's tables.
    assert all_jobs(store) == []
    assert leftovers(dsn) == ([], 0)
    assert spark_tables(dsn) == []


def test_misspelt_read_options_fail_before_anything_is_read(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    def read() -> Any:  # a reader keeps its options: a fresh one each time
        return spark.read.format("conveyor").option("dsn", dsn)

    with pytest.raises(AnalysisException, match='Did you mean "table"'):
        read().option("tabel", "jobs").load().collect()
    with pytest.raises(AnalysisException, match='Did you mean "numPartitions"'):
        read().option("table", "jobs").option("numPartition", "2").load().collect()
    with pytest.raises(AnalysisException, match="option numPartitions must be at least 1"):
        read().option("numPartitions", "0").load().count()
    stream = spark.readStream.format("conveyor").option("dsn", dsn)
    with pytest.raises(Exception, match='Did you mean "maxEventsPerTrigger"'):
        query = stream.option("maxOffsetsPerTrigger", "5").load().writeStream.format("noop").start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()


def test_on_redis_the_data_source_refuses_saying_what_it_needs(
    spark: SparkSession, redis_clean_dsn: str
) -> None:
    """Write, read and stream each refuse a Redis DSN up front, naming what works instead."""
    from conveyor.spark.storage import REDIS_REFUSAL, backend_of, open_storage

    needs = "the Spark data source needs SQLite or PostgreSQL"
    assert REDIS_REFUSAL.startswith(needs)
    for dsn in (redis_clean_dsn, "rediss://h:6380/0", "unix:///run/redis.sock"):
        with pytest.raises(ConfigurationError, match=needs):
            backend_of(dsn)
        with pytest.raises(ConfigurationError, match=needs):
            open_storage(dsn)
    with pytest.raises(AnalysisException, match=needs):
        writer(items(spark, 3), redis_clean_dsn, task="resize").save()
    with pytest.raises(AnalysisException, match=needs):
        spark.read.format("conveyor").option("dsn", redis_clean_dsn).load().collect()
    with pytest.raises(Exception, match=needs):
        stream = spark.readStream.format("conveyor").option("dsn", redis_clean_dsn)
        query = stream.load().writeStream.format("noop").start()
        try:
            query.processAllAvailable()
        finally:
            query.stop()


def test_a_write_table_keeps_its_options_and_names_its_columns_in_disguise() -> None:
    ddl = ddl_with_options(
        "image_id BIGINT NOT NULL, `odd ``name``` MAP<STRING, INT>, size: INT",
        {"dsn": "sqlite:///q.db", "task": "it's"},
    )
    first, rest = ddl.split(" COMMENT ", 1)
    assert first == "`iMaGe_Id` BIGINT NOT NULL"
    assert rest.endswith("', `oDd ``NaMe``` MAP<STRING, INT>, `sIzE`: INT")
    assert "it\\'s" in rest and '"@columns": ["image_id", "odd `name`", "size"]' in rest
    assert ddl_with_options("n INT", {}).startswith("`N` INT COMMENT")
    with pytest.raises(ConfigurationError, match="empty column"):
        ddl_with_options("a INT,, b INT", {})
