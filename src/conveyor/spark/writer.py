"""``df.write.format("conveyor")``: one job per row.

Atomic writes (the default) go through staging. Each task attempt writes its
rows into a table of its own (``spark_stage_<write>_<partition>_<attempt>``);
the driver's ``commit()`` moves the staged rows of the attempts Spark kept into
``jobs`` in one transaction, with their events and the wake-up of workers, and
drops every staging table of the write. Workers never see a staged row.

Why not insert into ``jobs`` from the tasks: when one task fails, Spark cancels
the others by ending their input early, and such a task can commit a truncated
partition *after* the driver's ``abort()`` ran. Here the write's row in
``spark_writes`` is the guard: commit and abort delete it, and a task checks
for it in every transaction it stages rows in, so a task that outlives the
write stages nothing (and whatever it staged before, abort drops). A driver
that dies leaves its row and staging tables: the next atomic write to the store
clears writes open longer than ``abandonedAfterHours``.

With ``atomic`` false, tasks insert through the store's own ``job_insert_many``
in batches: each batch is visible as soon as it commits, and a failed write
leaves the batches that committed. A key column still keeps task retries and
reruns from duplicating jobs.
"""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from conveyor.errors import ConveyorError
from conveyor.spark.db import (
    backend_of,
    postgres_connect,
    queries,
    quote_ident,
    sqlite_connect,
)
from conveyor.spark.rows import JobColumns, Where, WritePlan, prepare
from conveyor.store.sqlite.store import immediate_transaction

STAGE_PREFIX = "spark_stage_"

log = logging.getLogger("conveyor.spark")


class WriteEndedError(ConveyorError):
    """The write was already committed or aborted: a late task must not add to it."""


@dataclass(frozen=True, slots=True)
class StagedPart(WriterCommitMessage):
    """What one successful task attempt staged."""

    partition: int
    stage: str | None  # None: the task had no rows
    rows: int


@dataclass(frozen=True, slots=True)
class InsertedPart(WriterCommitMessage):
    partition: int
    rows: int


def open_store_migrated(dsn: str) -> None:
    """Bring the schema up to date once, on the driver, before any task runs."""
    from conveyor.store.dsn import open_store

    store = open_store(dsn)
    try:
        store.migrate()
    finally:
        store.close()


def _stage_prefix(write_id: str) -> str:
    return f"{STAGE_PREFIX}{write_id}_"


def _drop_stages(conn: Any, q: Mapping[str, str], write_id: str) -> None:
    """Drop every staging table of a write, including those of attempts Spark discarded."""
    # fetchall: SQLite cannot drop a table while a cursor reads the schema.
    tables = conn.execute(q["stage_tables"], {"prefix": _stage_prefix(write_id)}).fetchall()
    for (table,) in tables:
        conn.execute(q["stage_drop"].format(stage=quote_ident(table)))


def _clear_abandoned(conn: Any, q: Mapping[str, str], write_id: str) -> None:
    """Close a write whose driver died and drop what its tasks staged: none of it became jobs."""
    log.warning("clearing Spark write %s, abandoned by its driver", write_id)
    conn.execute(q["write_close"], {"id": write_id})
    _drop_stages(conn, q, write_id)


class ConveyorWriter(DataSourceArrowWriter):
    def __init__(self, dsn: str, plan: WritePlan) -> None:
        self.dsn = dsn
        self.backend = backend_of(dsn)
        self.plan = plan
        self.write_id = secrets.token_hex(6)
        open_store_migrated(dsn)
        if plan.atomic:
            self._open_write()

    @property
    def prefix(self) -> str:
        return _stage_prefix(self.write_id)

    # --- driver ---------------------------------------------------------------

    def _open_write(self) -> None:
        q = queries(self.backend)
        now = datetime.now(UTC)
        before = now - self.plan.abandoned_after
        if self.backend == "sqlite":
            conn = sqlite_connect(self.dsn)
            try:
                with immediate_transaction(conn):
                    for (write_id,) in conn.execute(
                        q["write_abandoned"], {"before": before.timestamp()}
                    ).fetchall():
                        _clear_abandoned(conn, q, write_id)
                    conn.execute(q["write_open"], {"id": self.write_id, "now": now.timestamp()})
            finally:
                conn.close()
        else:
            with postgres_connect(self.dsn) as pg, pg.transaction():
                for (write_id,) in pg.execute(q["write_abandoned"], {"before": before}).fetchall():
                    _clear_abandoned(pg, q, write_id)
                pg.execute(q["write_open"], {"id": self.write_id, "now": now})

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if not self.plan.atomic:
            return
        parts = sorted(
            (m for m in messages if isinstance(m, StagedPart) and m.stage is not None),
            key=lambda m: m.partition,
        )
        self._finish([m.stage for m in parts if m.stage is not None])

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.plan.atomic:
            self._finish(None)

    def _finish(self, stages: list[str] | None) -> None:
        """Move ``stages`` into jobs (None: abort), close the write, drop all its staging."""
        q = queries(self.backend)
        now = datetime.now(UTC)
        if self.backend == "sqlite":
            conn = sqlite_connect(self.dsn)
            try:
                with immediate_transaction(conn):
                    if conn.execute(q["write_close"], {"id": self.write_id}).rowcount != 1:
                        if stages is None:
                            return
                        raise WriteEndedError(f"write {self.write_id} was already ended")
                    if stages:
                        self._move_sqlite(conn, stages, now)
                    _drop_stages(conn, q, self.write_id)
            finally:
                conn.close()
            return
        with postgres_connect(self.dsn) as pg, pg.transaction():
            # Deleting the row waits for tasks still staging under FOR SHARE; the
            # tables listed after it include everything they staged.
            if pg.execute(q["write_close"], {"id": self.write_id}).rowcount != 1:
                if stages is None:
                    return
                raise WriteEndedError(f"write {self.write_id} was already ended")
            if stages:
                union = " UNION ALL ".join(
                    q["stage_part"].format(part=index, stage=quote_ident(stage))
                    for index, stage in enumerate(stages)
                )
                pg.execute(
                    q["stage_move"].format(stages=union),
                    {"now": now, "unique": self.plan.unique},
                )
            _drop_stages(pg, q, self.write_id)

    def _move_sqlite(self, conn: Any, stages: list[str], now: datetime) -> None:
        q = queries("sqlite")
        counts = [
            conn.execute(q["stage_count"].format(stage=quote_ident(s))).fetchone()[0]
            for s in stages
        ]
        total = sum(counts)
        if not total:
            return
        # Ids from the store's counter row, reserved under this write lock: never
        # the ids of jobs enqueued any other way.
        last = conn.execute(q["job_take_ids"], {"count": total}).fetchone()[0]
        first = last - total + 1
        offset = first
        for stage, count in zip(stages, counts, strict=True):
            conn.execute(
                q["stage_move"].format(stage=quote_ident(stage)),
                {"first": offset, "now": now.timestamp(), "unique": self.plan.unique},
            )
            offset += count
        conn.execute(q["event_insert_enqueued"], {"first": first, "last": last})

    # --- tasks ----------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.taskAttemptId() if context else 0
        batches = _rebatch(iterator, self.plan.batch_size)
        if not self.plan.atomic:
            return InsertedPart(partition, self._insert_directly(batches, partition))
        stage = f"{self.prefix}{partition}_{attempt}"
        if self.backend == "sqlite":
            rows = self._stage_sqlite(batches, stage, partition)
        else:
            rows = self._stage_postgres(batches, stage, partition)
        return StagedPart(partition, stage if rows else None, rows)

    def _stage_sqlite(self, batches: Iterator[pa.RecordBatch], stage: str, partition: int) -> int:
        q = queries("sqlite")
        table = quote_ident(stage)
        insert = q["stage_insert"].format(stage=table)
        rows = 0
        conn = sqlite_connect(self.dsn)
        try:
            for batch in batches:
                jobs = prepare(batch, self.plan, Where(partition, rows))
                # One short transaction per batch, not one for the task: SQLite
                # has one writer, and the other tasks stage at the same time.
                with immediate_transaction(conn):
                    if conn.execute(q["write_is_open"], {"id": self.write_id}).fetchone() is None:
                        raise WriteEndedError(f"write {self.write_id} ended before this task")
                    if rows == 0:
                        conn.execute(q["stage_create"].format(stage=table))
                    conn.executemany(insert, jobs.rows())
                rows += len(jobs)
        finally:
            conn.close()
        return rows

    def _stage_postgres(self, batches: Iterator[pa.RecordBatch], stage: str, partition: int) -> int:
        q = queries("postgres")
        table = quote_ident(stage)
        rows = 0
        with postgres_connect(self.dsn) as pg:
            for batch in batches:
                jobs = prepare(batch, self.plan, Where(partition, rows))
                with pg.transaction():
                    if pg.execute(q["write_is_open"], {"id": self.write_id}).fetchone() is None:
                        raise WriteEndedError(f"write {self.write_id} ended before this task")
                    if rows == 0:
                        pg.execute(q["stage_create"].format(stage=table))
                    with pg.cursor().copy(q["stage_copy"].format(stage=table)) as copy:
                        copy.write(_csv(jobs))
                rows += len(jobs)
        return rows

    def _insert_directly(self, batches: Iterator[pa.RecordBatch], partition: int) -> int:
        from conveyor.job import NewJob
        from conveyor.store.dsn import open_store

        store = open_store(self.dsn)
        rows = 0
        try:
            for batch in batches:
                jobs = prepare(batch, self.plan, Where(partition, rows))
                now = datetime.now(UTC)
                new = [
                    NewJob(
                        queue=queue, task=task, args_json=args, kwargs_json=kwargs,
                        run_at=now if run_at is None else datetime.fromtimestamp(run_at, UTC),
                        priority=priority, max_attempts=max_attempts, key=key,
                        unique=self.plan.unique, group=group, batch=batch_id,
                    )
                    for (queue, task, args, kwargs, priority, run_at, max_attempts, key, group,
                         batch_id) in jobs.rows()
                ]  # fmt: skip
                store.job_insert_many(new, now)
                rows += len(new)
        finally:
            store.close()
        return rows


def _rebatch(iterator: Iterator[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    """Record batches of ``size`` rows (the last one smaller), whatever Spark sends."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in iterator:
        pending.append(batch)
        count += batch.num_rows
        while count >= size:
            table = pa.Table.from_batches(pending)
            head, rest = table.slice(0, size), table.slice(size)
            yield head.combine_chunks().to_batches()[0]
            pending = rest.combine_chunks().to_batches() if rest.num_rows else []
            count = rest.num_rows
    if count:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


_CSV_SCHEMA = pa.schema(
    [
        ("queue", pa.string()),
        ("task", pa.string()),
        ("args", pa.string()),
        ("kwargs", pa.string()),
        ("priority", pa.int32()),
        ("run_at", pa.float64()),
        ("max_attempts", pa.int32()),
        ("key", pa.string()),
        ("group_key", pa.string()),
        ("batch", pa.string()),
    ]
)


def _csv(jobs: JobColumns) -> bytes:
    """The batch as CSV for COPY, written by Arrow's C++ writer (not row by row in Python).

    Arrow quotes every string and leaves nulls unquoted and empty, which is
    exactly how PostgreSQL's CSV tells an empty string from NULL.
    """
    import pyarrow.csv as pacsv

    table = pa.Table.from_arrays(
        [
            pa.array(jobs.queue, pa.string()),
            pa.array(jobs.task, pa.string()),
            pa.array(jobs.args, pa.string()),
            pa.array(jobs.kwargs, pa.string()),
            pa.array(jobs.priority, pa.int32()),
            pa.array(jobs.run_at, pa.float64()),
            pa.array(jobs.max_attempts, pa.int32()),
            pa.array(jobs.key, pa.string()),
            pa.array(jobs.group, pa.string()),
            pa.array(jobs.batch, pa.string()),
        ],
        schema=_CSV_SCHEMA,
    )
    out = io.BytesIO()
    pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
    return out.getvalue()
