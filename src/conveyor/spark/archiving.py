"""Archive terminal jobs to Parquet, then delete from the store exactly what was written.

``archive(spark, dsn, older_than=timedelta(days=7), to="/data/conveyor-archive")``

What is archived: jobs that are succeeded, failed or cancelled and finished
before ``now - older_than``, each as one row with its history nested in an
``events`` column (an array of structs in ``seq`` order). One row holds a job
and all its events, so a Parquet file that exists holds whole jobs: there is
no state in which a job's row was written but its events were not.

Layout: ``to/date=YYYY-MM-DD/queue=NAME/part-*.parquet``, partitioned by the
UTC date the job finished and by its queue. ``spark.read.parquet(to)`` reads it
all; ``read_archive(spark, to)`` does the same with the partition columns typed
as written (Spark otherwise guesses that a queue named ``2024`` is a number).
Each row also carries ``archived_at`` and ``archive_run``, the run that wrote it.

How a run stays safe when it stops half-way (a crash, a killed driver, a lost
database connection):

1. Select the eligible jobs (one read, kept for the run) and their events.
2. Leave out the jobs the archive already holds, compared on
   ``(id, finished_at)``, and append the rest to ``to`` in one Spark write.
   Spark makes files visible only when the write commits.
3. Read the archive back and delete from the store the eligible jobs it holds
   (again on ``(id, finished_at)``), with their events, in chunks. The store
   deletes a job only if it is still terminal and finished before the cutoff:
   one retried by hand since step 1 is live again and stays.

A crash before step 2 commits leaves nothing behind; a crash after it, or in
the middle of step 3, leaves jobs in both places, and the next run finds them
in the archive (step 2 skips them, so nothing is written twice) and deletes
them (step 3). The store never loses a job the archive does not hold.

A job retried by hand after it was archived and finished again later has a
new ``finished_at``: it is archived again as a second row for the same id, its
newer history complete. Run one archive at a time per ``to``: two concurrent
runs may both write the same new jobs (the rows are identical; deduplicate on
``(id, finished_at)`` when reading if that ever happened).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.job import JobState
from conveyor.store.capabilities import sql_store
from conveyor.store.dsn import open_store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: Jobs deleted per store call: small enough for a short write transaction.
DELETE_CHUNK = 5_000
_TERMINAL = [str(JobState.SUCCEEDED), str(JobState.FAILED), str(JobState.CANCELLED)]
_EVENT_FIELDS = ("seq", "kind", "attempt", "worker", "at", "error", "started_at")
_MISSING_PATH = "PATH_NOT_FOUND"

#: Called as ``progress(stage, done, total)``: "selected" (jobs eligible),
#: "written" (jobs this run wrote), then "deleting" as chunks are deleted.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class ArchiveResult:
    path: str
    run: str
    cutoff: datetime
    #: Terminal jobs finished before the cutoff, found in the store.
    selected: int
    #: Of those, the jobs this run wrote (the rest were archived by an earlier run).
    written: int
    #: Jobs deleted from the store, with their events.
    deleted: int


def archive(
    spark: SparkSession,
    dsn: str,
    older_than: timedelta,
    to: str,
    *,
    now: datetime | None = None,
    progress: Progress | None = None,
    delete_chunk: int = DELETE_CHUNK,
    keep: bool = False,
) -> ArchiveResult:
    """Move terminal jobs finished more than ``older_than`` ago to Parquet at ``to``.

    See the module for the layout and why a rerun finishes what a crashed run
    started. ``progress`` is told how far the run got (the command line shows
    it; raising from it stops the run there, as a crash would). ``keep=True``
    writes the archive and deletes nothing: a copy, which a later run (with or
    without ``keep``) does not write again, since it skips what the archive holds.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from conveyor.spark import read_table

    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than}")
    if delete_chunk < 1:
        raise ValueError(f"delete_chunk must be at least 1, got {delete_chunk}")
    now = (now or datetime.now(UTC)).astimezone(UTC)
    cutoff = now - older_than
    run = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    report: Progress = progress or (lambda stage, done, total: None)

    # Kept for the run: the write and the delete must see the same selection,
    # though workers keep finishing jobs meanwhile.
    selected = read_table(spark, dsn, "jobs", state=_TERMINAL, finished_at_until=cutoff).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        total = selected.count()
        report("selected", total, total)
        keys = selected.select("id", "finished_at")

        archived = _archived_keys(spark, to, cutoff)
        new = (
            selected
            if archived is None
            else selected.join(archived.drop("archive_run"), ["id", "finished_at"], "left_anti")
        )
        events = (
            read_table(spark, dsn, "events")
            .join(keys.select(F.col("id").alias("job_id")), "job_id", "left_semi")
            .groupBy("job_id")
            .agg(F.sort_array(F.collect_list(F.struct(*_EVENT_FIELDS))).alias("events"))
        )
        rows = (
            new.join(events, new["id"] == events["job_id"], "left_outer")
            .drop("job_id")
            .withColumn("archived_at", F.lit(now))
            .withColumn("archive_run", F.lit(run))
            .withColumn("date", _utc_date("finished_at"))
        )
        # Without this, an empty write would still leave a _SUCCESS file (and,
        # on an empty archive, a folder Spark cannot infer a schema from). Asked
        # of ``new``, not ``rows``: that would read the events table twice.
        if not new.isEmpty():
            rows.write.mode("append").partitionBy("date", "queue").parquet(to)

        # Read back what the archive holds now, whichever run wrote it: those
        # of the selected jobs are the ones to delete; ours are what this run wrote.
        held = _archived_keys(spark, to, cutoff)
        found: dict[int, bool] = {}
        if held is not None:
            mine = (F.col("archive_run") == run).alias("mine")
            for row in keys.join(held, ["id", "finished_at"]).select("id", mine).collect():
                found[int(row["id"])] = found.get(int(row["id"]), False) or bool(row["mine"])
        written = sum(found.values())
        report("written", written, total)
        ids = sorted(found)
        deleted = 0 if keep else _delete(dsn, ids, cutoff, delete_chunk, report)
    finally:
        selected.unpersist()
    return ArchiveResult(to, run, cutoff, total, written, deleted)


def _utc_date(column: str) -> Column:
    from pyspark.sql import functions as F

    # From epoch seconds, not to_date(): that follows the session time zone,
    # and a partition's date must not depend on where the driver runs.
    return F.date_from_unix_date(F.floor(F.unix_seconds(F.col(column)) / 86_400).cast("int"))


def _archived_keys(spark: SparkSession, to: str, cutoff: datetime) -> DataFrame | None:
    """``(id, finished_at, archive_run)`` of archived jobs that could be eligible, or None."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    try:
        frame = spark.read.schema(_key_schema()).parquet(to)
        # Under Spark Connect nothing is analysed until asked: ask now, inside
        # the try, so that a missing archive is found here.
        frame.schema  # noqa: B018
    except AnalysisException as exc:
        if exc.getCondition() == _MISSING_PATH:
            return None
        raise
    # Partition pruning: nothing finished after the cutoff's date can match.
    frame = frame.where(F.col("date") <= F.lit(cutoff.date()))
    return frame.select("id", "finished_at", "archive_run")


def _key_schema() -> StructType:
    from pyspark.sql.types import (
        DateType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    return StructType(
        [
            StructField("id", LongType()),
            StructField("finished_at", TimestampType()),
            StructField("archive_run", StringType()),
            StructField("date", DateType()),
            StructField("queue", StringType()),
        ]
    )


def _delete(dsn: str, ids: list[int], cutoff: datetime, chunk: int, report: Progress) -> int:
    store = open_store(dsn)
    try:
        archive = sql_store(store, "delete archived jobs")
        deleted = 0
        report("deleting", 0, len(ids))
        for start in range(0, len(ids), chunk):
            deleted += len(archive.job_delete_terminal(ids[start : start + chunk], cutoff))
            report("deleting", min(start + chunk, len(ids)), len(ids))
        return deleted
    finally:
        store.close()


def read_archive(spark: SparkSession, to: str) -> DataFrame:
    """The archive at ``to`` with ``date`` as a date and ``queue`` as text, whatever the names."""
    from pyspark.sql.types import StringType, StructField, StructType

    inferred = spark.read.parquet(to).schema
    fields = [
        StructField(f.name, StringType(), f.nullable) if f.name == "queue" else f
        for f in inferred.fields
    ]
    return spark.read.schema(StructType(fields)).parquet(to)
