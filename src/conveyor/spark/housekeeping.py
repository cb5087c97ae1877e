"""What an operator does with Spark's writes: list them, clear abandoned ones, purge results.

A write's driver that dies between opening the write and its commit leaves
its row in ``spark_writes`` and its staging tables; a write is taken for
abandoned once it has been open longer than ``abandoned_after`` (24 hours by
default, the default of the write option ``abandonedAfterHours``). Three things
clear it: the next write to the store (writes open longer than its own
``abandonedAfterHours``), ``cleanup()`` (``conveyor spark cleanup``) now, and
the periodic task ``schedule_cleanup()`` declares, which the workers'
maintenance enqueues on its schedule.

Results of past writes are kept ``results_retention`` (30 days by default):
within it a rerun under the same ``writeId`` enqueues nothing; after it the
id may be used again.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.spark.rows import DEFAULT_ABANDONED_AFTER_HOURS
from conveyor.spark.storage import Cleanup, WriteRow, open_storage

if TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.task import Task

__all__ = [
    "ABANDONED_AFTER",
    "CLEANUP_EVERY",
    "CLEANUP_TASK",
    "RESULTS_RETENTION",
    "cleanup",
    "schedule_cleanup",
    "writes",
]

log = logging.getLogger("conveyor.spark")

#: A write open this long is taken for abandoned (the write option's default).
ABANDONED_AFTER = timedelta(hours=DEFAULT_ABANDONED_AFTER_HOURS)
#: How long the result of a past write is kept.
RESULTS_RETENTION = timedelta(days=30)
#: How often the periodic cleanup runs.
CLEANUP_EVERY = timedelta(hours=1)
#: The name of the periodic cleanup task.
CLEANUP_TASK = "conveyor.spark.cleanup"


def writes(
    dsn: str, limit: int = 50, abandoned_after: timedelta = ABANDONED_AFTER
) -> list[WriteRow]:
    """The newest ``limit`` writes, committed ones and open ones, newest first."""
    store = open_storage(dsn)
    try:
        if store.spark_schema_version() == 0:
            return []  # no Spark write ever ran here
        store.spark_migrate()
        return store.bulk_write_list(limit, datetime.now(UTC) - abandoned_after)
    finally:
        store.close()


def cleanup(
    dsn: str,
    abandoned_after: timedelta = ABANDONED_AFTER,
    results_retention: timedelta | None = RESULTS_RETENTION,
) -> Cleanup:
    """Clear writes open longer than ``abandoned_after`` and purge old results, now.

    ``results_retention`` None keeps every result.
    """
    now = datetime.now(UTC)
    store = open_storage(dsn)
    try:
        if store.spark_schema_version() == 0:
            return Cleanup([], 0)
        store.spark_migrate()
        done = store.bulk_write_cleanup(
            now - abandoned_after, None if results_retention is None else now - results_retention
        )
    finally:
        store.close()
    for write_id in done.cleared:
        log.warning("cleared Spark write %s, abandoned by its driver", write_id)
    for write_id in done.settled:
        log.warning("settled Spark write %s, whose committer died with pieces prepared", write_id)
    return done


def schedule_cleanup(
    app: App,
    dsn: str,
    *,
    every: timedelta = CLEANUP_EVERY,
    abandoned_after: timedelta = ABANDONED_AFTER,
    results_retention: timedelta | None = RESULTS_RETENTION,
    queue: str = "default",
) -> Task[[], None]:
    """Declare on ``app`` a periodic task that runs ``cleanup`` every ``every``.

    The workers' maintenance enqueues it once per tick, whichever worker leads;
    a worker of ``queue`` runs it.
    """

    def spark_cleanup() -> None:
        done = cleanup(dsn, abandoned_after, results_retention)
        log.info(
            "Spark cleanup: %d abandoned writes cleared, %d left prepared settled, "
            "%d results purged",
            len(done.cleared),
            len(done.settled),
            done.purged,
        )

    task: Task[[], None] = app.periodic(every=every, queue=queue, name=CLEANUP_TASK)(spark_cleanup)
    return task
