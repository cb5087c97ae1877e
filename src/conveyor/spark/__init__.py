"""conveyor on Apache Spark: DataFrames in as jobs, jobs and events out.

Needs the ``spark`` extra (``pip install 'conveyor[spark]'``)::

    from conveyor.spark import register
    register(spark)
    df.write.format("conveyor").option("dsn", dsn).option("task", "resize").mode("append").save()
    result = enqueue(df, dsn, task="resize")        # the same, and what it did
    jobs = spark.read.format("conveyor").option("dsn", dsn).option("table", "jobs").load()
    events = spark.readStream.format("conveyor").option("dsn", dsn).load()

Everything here works on a classic session and under Spark Connect alike.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

try:
    import pyarrow  # noqa: F401  (the data source API needs it; fail here with the hint)
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"conveyor.spark needs PySpark and pyarrow: pip install 'conveyor[spark]' ({exc})"
    ) from None

from conveyor.spark.source import NAME, ConveyorDataSource
from conveyor.spark.storage import WriteResult, open_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "NAME",
    "ConveyorDataSource",
    "WriteResult",
    "activate",
    "archive",
    "batch_results",
    "cleanup",
    "enqueue",
    "read_archive",
    "read_table",
    "register",
    "report",
    "schedule_cleanup",
    "session",
    "write_result",
    "writes",
]

# Filter pushdown of Python data sources is off by default in Spark, and a
# reader that implements it fails unless it is on.
_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# Filters read_table() understands: column -> values (one value or a list).
_FILTER_COLUMNS = frozenset(
    {"state", "queue", "task", "batch", "key", "group_key", "worker", "kind", "job_id", "id"}
)
_TIME_BOUNDS = ("_since", "_until")


def register(spark: SparkSession) -> None:
    """Register the ``conveyor`` data source on ``spark`` and turn on filter pushdown.

    Also makes ``spark`` the active session of the calling thread (see ``activate``).
    """
    activate(spark)
    spark.conf.set(_PUSHDOWN_CONF, "true")
    spark.dataSource.register(ConveyorDataSource)


def activate(spark: SparkSession) -> None:
    """Make ``spark`` the active session of the calling thread, where Spark looks for data sources.

    On a classic session, Spark finds a Python data source through the JVM's
    active session, which is per thread: a thread other than the one that made
    the session has none, and ``df.write.format("conveyor")`` there fails with
    ``DATA_SOURCE_NOT_FOUND``. ``enqueue``, ``read_table`` and the pipelines
    call this themselves; a thread that uses ``df.write`` or ``spark.read``
    directly calls it (or ``register``) first. Spark Connect needs nothing.
    """
    jvm = getattr(spark, "_jvm", None)
    session = getattr(spark, "_jsparkSession", None)
    if jvm is None or session is None:
        return  # Spark Connect: the server resolves data sources in its own session
    from pyspark.sql import SparkSession as ClassicSession

    ClassicSession._get_j_spark_session_class(jvm).setActiveSession(session)


def session(
    master: str = "local[*]",
    app_name: str = "conveyor",
    conf: dict[str, str] | None = None,
    *,
    connect: bool = False,
) -> SparkSession:
    """A SparkSession with the data source registered, for scripts and notebooks.

    Spark's Python workers run ``python3`` from PATH unless told otherwise; this
    points them at the running interpreter, the one that has conveyor installed.
    With ``connect``, the session is a Spark Connect client: of a local Connect
    server that Spark starts for a ``local[...]`` master (as
    ``SparkSession.builder.remote("local[2]")`` does), or of the server an
    ``sc://host:port`` URL names. On a cluster, build the session your cluster
    needs and call ``register()``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    builder = builder.remote(master) if connect else builder.master(master)
    builder = builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def enqueue(frame: DataFrame, dsn: str, **options: Any) -> WriteResult:
    """Enqueue one job per row of ``frame`` and say what the write did.

    ``options`` are those of ``df.write.format("conveyor")`` by their names
    (``task="resize", keyColumn="image_id"``). The write gets an id of its own
    unless ``writeId`` is given; a rerun with a ``writeId`` that was committed
    before enqueues nothing and returns that write's result (``new`` false).
    Returns the counts the store recorded: rows given, jobs enqueued, rows
    skipped as duplicates.
    """
    from conveyor.spark.options import Options

    # Checked here as typed: PySpark lowercases option names before the data source
    # sees them, and a misspelt keyColum is best quoted as the caller wrote it.
    Options({name: _option_text(value) for name, value in options.items()}, "write")
    activate(frame.sparkSession)
    names = {name.lower(): name for name in options}
    write_id = str(options[names["writeid"]]) if "writeid" in names else secrets.token_hex(8)
    before = write_result(dsn, write_id) if "writeid" in names else None
    writer = frame.write.format(NAME).option("dsn", dsn).option("writeId", write_id)
    for name, value in options.items():
        if name.lower() != "writeid":
            writer = writer.option(name, _option_text(value))
    writer.mode("append").save()
    result = write_result(dsn, write_id)
    if result is None:  # pragma: no cover - the commit records it before save() returns
        raise RuntimeError(f"write {write_id} left no result in the store")
    return replace(result, new=before is None)


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def write_result(dsn: str, write_id: str) -> WriteResult | None:
    """What the write with this id did (rows, enqueued, skipped), or None if none committed.

    A streaming sink's result is ``"stream:<query id>"``: its counts add up all
    its micro-batches, and ``batch`` is the last one committed. On a database no
    Spark write used yet, this makes Spark's tables first (empty: None).
    """
    store = open_storage(dsn)
    try:
        store.spark_migrate()
        return store.bulk_write_result(write_id)
    finally:
        store.close()


def read_table(
    spark: SparkSession,
    dsn: str,
    table: str = "jobs",
    *,
    columns: list[str] | None = None,
    **filters: Any,
) -> DataFrame:
    """``table`` ("jobs" or "events") as a DataFrame, filtered in the database.

    ``filters``: a column (state, queue, task, batch, key, group_key, worker, kind,
    job_id, id) equal to a value or one of a list
    (``state=["failed", "cancelled"]``), and time bounds on a timestamp column
    as ``<column>_since`` (inclusive) and ``<column>_until`` (exclusive), e.g.
    ``finished_at_since=datetime(...)``. They reach SQL through Spark's filter
    pushdown. ``columns`` reads only those columns (and, to filter on them, the
    filters' own columns, which are then left out).
    """
    from pyspark.sql import functions as F

    from conveyor.spark.tables import TABLES

    known = {c.name: c for c in TABLES[table]} if table in TABLES else {}
    activate(spark)
    reader = spark.read.format(NAME).option("dsn", dsn).option("table", table)
    if columns is not None:
        filtered = [n.rsplit("_", 1)[0] if n.endswith(_TIME_BOUNDS) else n for n in filters]
        read = list(dict.fromkeys([*columns, *filtered]))
        reader = reader.option("columns", ",".join(read))
    frame = reader.load()
    for name, value in filters.items():
        if name.endswith(_TIME_BOUNDS):
            column_name = name.rsplit("_", 1)[0]
            column = known.get(column_name)
            if column is None or not column.timestamp:
                raise TypeError(f"read_table: {name} names no timestamp column of {table}")
            col = F.col(column_name)
            frame = frame.where(col >= F.lit(value) if name.endswith("_since") else col < value)
            continue
        if name not in _FILTER_COLUMNS or name not in known:
            raise TypeError(f"read_table: {table} cannot be filtered on {name!r}")
        if isinstance(value, list | tuple | set | frozenset):
            frame = frame.where(F.col(name).isin(list(value)))
        else:
            frame = frame.where(F.col(name) == F.lit(value))
    if columns is not None and len(read) > len(columns):
        frame = frame.select(*columns)
    return frame


# The pipelines on top of the data source. Imported last: they reach read_table
# through this module when they run.
from conveyor.spark.analytics import report  # noqa: E402
from conveyor.spark.archiving import archive, read_archive  # noqa: E402
from conveyor.spark.fanin import batch_results  # noqa: E402
from conveyor.spark.housekeeping import cleanup, schedule_cleanup, writes  # noqa: E402
