"""``df.write.format("conveyor")`` and ``df.writeStream.format("conveyor")``: one job per row.

Atomic writes (the default) go through staging. Each task attempt appends its
rows to a table of its own; the driver's ``commit()`` moves the staged rows of
the attempts Spark kept into ``jobs`` in one transaction, by the store's rules
of an enqueue (keys, ``enqueued`` events, the wake-up of workers), records
what the write did, and drops every staging table of the write. Workers never
see a staged row.

Why not insert into ``jobs`` from the tasks: when one task fails, Spark cancels
the others by ending their input early, and such a task can commit a truncated
partition *after* the driver's ``abort()`` ran. The write's row in
``spark_writes`` is the guard: commit and abort delete it, and a task checks
for it in every transaction it stages rows in, so a task that outlives the
write stages nothing. A driver that dies leaves its row and staging tables:
the next write to the store clears writes open longer than
``abandonedAfterHours``.

With ``atomic`` false each batch of a task is enqueued in its own transaction,
visible as it commits, and that transaction also records how many rows of the
partition are done (with a checksum of them). A retried task skips the rows
its failed attempt enqueued, after checking that they are the same rows.

A streaming sink treats each micro-batch as an atomic write: its tasks open it,
its commit moves it, and the store records the query's last committed batch,
so a batch Spark runs again after a restart from the checkpoint (it crashed
between our commit and its own) is recognised and enqueued once.

Every write's counts (rows given, jobs enqueued, rows skipped as duplicates)
are written to the driver's log and recorded in the store, where
``conveyor.spark.write_result(dsn, write_id)`` reads them.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from conveyor.errors import ConfigurationError, SchemaMissingError
from conveyor.spark.rows import JobColumns, RowError, Where, WritePlan, prepare
from conveyor.spark.storage import (
    PATH_ONE_TRANSACTION,
    PATH_PER_PARTITION,
    PATH_PIECES,
    BatchStep,
    Progress,
    SparkStorage,
    WriteCommit,
    WriteConflictError,
    WriteEndedError,
    WriteResult,
    open_storage,
    stage_name,
)

log = logging.getLogger("conveyor.spark")

__all__ = ["ConveyorStreamWriter", "ConveyorWriter", "WriteConflictError", "WriteEndedError"]

_CHECKSUM_MODULUS = 2**64


@dataclass(frozen=True, slots=True)
class StagedPart(WriterCommitMessage):
    """What one successful task attempt staged."""

    partition: int
    stage: str | None  # None: the task had no rows
    rows: int
    #: A streaming micro-batch: the query's id, read from the task's context.
    query: str | None = None
    #: Rows whose key column is null.
    null_keys: int = 0


@dataclass(frozen=True, slots=True)
class InsertedPart(WriterCommitMessage):
    partition: int
    rows: int
    #: Rows enqueued without a key (their key column was null).
    keyless: int = 0


def driver_log() -> logging.Logger:
    """The logger whose lines reach the driver's log.

    ``commit()`` runs in Spark's Python planner process on the driver, whose
    standard error goes to the driver's log; nothing configures logging there,
    so without a handler of its own an INFO line would be dropped.
    """
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    return log


def describe(result: WriteResult) -> str:
    keyless = f", {result.keyless} enqueued without a key (null key)" if result.keyless else ""
    return (
        f"{result.rows} rows: {result.enqueued} jobs enqueued{keyless}, {result.skipped} rows "
        "skipped as duplicates (a job of their queue held their key)"
    )


def committed_how(result: WriteResult) -> str:
    """The commit path, as the driver's log says it."""
    return f"committed {_PATH_WORDS.get(result.path, result.path)}"


_PATH_WORDS = {
    PATH_PIECES: "in parallel pieces",
    PATH_ONE_TRANSACTION: "in one transaction",
    PATH_PER_PARTITION: "per partition, batch by batch",
}


def null_key_refusal(column: str, count: int, where: str) -> str:
    return (
        f"{count} rows {where}have a null key column {column!r}: option nullKeys is "
        '"refuse" (the default), so the write stops. Filter them out (.where(col.isNotNull())), '
        'or pass nullKeys "keyless" to enqueue them without a key (then never skipped as '
        "duplicates)"
    )


def check_tables(store: SparkStorage, plan: WritePlan) -> None:
    """Refuse a database without conveyor's tables, unless told to make them; bring them up to date.

    Such a database is most often the wrong one (a typo in the DSN, a new SQLite
    file): jobs enqueued there would never reach a worker.
    """
    if store.schema_version() == 0 and not plan.create_tables:
        raise SchemaMissingError(
            f"{store.description} has no conveyor tables, so no worker reads jobs from it: "
            "run `conveyor migrate` against it (or app.migrate()) if it is the right database, "
            'or pass option createTables "true" to make them with this write'
        )
    store.migrate()
    store.spark_migrate()


def _task_context() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # called by hand, outside Spark
        return 0, 0, None
    return context.partitionId(), context.taskAttemptId(), context


def _rebatch(
    iterator: Iterator[pa.RecordBatch], size: int, names: tuple[str, ...] | None = None
) -> Iterator[pa.RecordBatch]:
    """Record batches of ``size`` rows (the last one smaller), whatever Spark sends.

    With ``names``, the columns are renamed to them (a SQL table's, see WritePlan.renamed).
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    for given in iterator:
        batch = given.rename_columns(list(names)) if names else given
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


class _Staging:
    """What batch writes and streaming micro-batches share: staging a task's rows."""

    dsn: str
    plan: WritePlan

    def _stage(
        self, store: SparkStorage, batches: Iterator[pa.RecordBatch], write_id: str, stage: str,
        partition: int,
    ) -> tuple[int, int]:  # fmt: skip
        """Stage the rows; return how many, and how many of them have a null key."""
        rows = null_keys = 0
        for batch in batches:
            jobs = prepare(batch, self.plan, Where(partition, rows))
            store.bulk_stage(write_id, stage, staged_rows(store, jobs), create=rows == 0)
            rows += len(jobs)
            null_keys += jobs.null_keys(self.plan)
        return rows, null_keys

    def _refuse_null_keys(self, store: SparkStorage, write_id: str, parts: list[StagedPart]) -> int:
        """The rows with a null key; with nullKeys "refuse", end the write and raise if any."""
        count = sum(m.null_keys for m in parts)
        if count and self.plan.null_keys == "refuse":
            store.bulk_write_abort(write_id)
            raise RowError(null_key_refusal(self.plan.columns["key"], count, "of the write "))
        return count


class ConveyorWriter(_Staging, DataSourceArrowWriter):
    def __init__(self, dsn: str, plan: WritePlan) -> None:
        self.dsn = dsn
        self.plan = plan
        #: This run of the write: its guard row and staging tables. Never the caller's id,
        #: so a rerun under that id can start at once even if a run before it died.
        self.write_id = secrets.token_hex(8)
        #: Where the store records what the write did: the caller's id, else the run's.
        self.result_id = plan.write_id or self.write_id
        #: Set when the caller's write id was committed before: this run enqueues nothing.
        self.done_before: WriteResult | None = None
        store = open_storage(dsn)
        try:
            # Bring the store's schema and Spark's tables up to date once, on the
            # driver, before any task runs.
            check_tables(store, plan)
            if plan.write_id is not None:
                self.done_before = store.bulk_write_result(plan.write_id)
                if self.done_before is not None:
                    _check_same_options(
                        plan.write_id, store.bulk_write_options(plan.write_id), plan.described
                    )
            if self.done_before is None:
                now = datetime.now(UTC)
                cleared = store.bulk_write_open(
                    self.write_id, now, now - plan.abandoned_after, self.result_id
                )
                for write_id in cleared:
                    log.warning("cleared Spark write %s, abandoned by its driver", write_id)
        finally:
            store.close()

    # --- driver ---------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.done_before is not None:
            driver_log().info(
                "conveyor write %s was committed before, at %s (%s); this run enqueued nothing",
                self.result_id,
                self.done_before.committed_at.isoformat(),
                describe(self.done_before),
            )
            return
        store = open_storage(self.dsn)
        try:
            if self.plan.atomic:
                parts = sorted(
                    (m for m in messages if isinstance(m, StagedPart) and m.stage is not None),
                    key=lambda m: m.partition,
                )
                keyless = self._refuse_null_keys(store, self.write_id, parts)
                commit = WriteCommit(
                    self.write_id,
                    [m.stage for m in parts if m.stage is not None],
                    self.plan.unique,
                    datetime.now(UTC),
                    self.result_id,
                    pieces=self.plan.commit_pieces,
                    keyless=keyless,
                )
                result = store.bulk_write_commit(commit)
            else:
                keyless = sum(m.keyless for m in messages if isinstance(m, InsertedPart))
                result = store.bulk_write_finish(
                    self.write_id, datetime.now(UTC), self.result_id, keyless
                )
            # After the commit, in a transaction of its own: a driver that dies in
            # between leaves a result without options, which a rerun does not check.
            store.bulk_write_describe(self.result_id, self.plan.described)
        finally:
            store.close()
        if result.new:
            driver_log().info(
                "conveyor write %s %s: %s", self.result_id, committed_how(result), describe(result)
            )
        else:
            driver_log().info(
                "conveyor write %s was committed by another run meanwhile (%s); this run "
                "enqueued nothing",
                self.result_id,
                describe(result),
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.done_before is not None:
            return
        store = open_storage(self.dsn)
        try:
            store.bulk_write_abort(self.write_id)
        finally:
            store.close()
        kept = "nothing of it was kept" if self.plan.atomic else "the batches that committed stay"
        driver_log().warning("conveyor write %s failed: %s", self.result_id, kept)

    # --- tasks ----------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition, attempt, _ = _task_context()
        if self.done_before is not None:
            for _batch in iterator:  # read to the end: Spark's side expects its input taken
                pass
            return StagedPart(partition, None, 0)
        batches = _rebatch(iterator, self.plan.batch_size, self.plan.renamed)
        store = open_storage(self.dsn)
        try:
            if not self.plan.atomic:
                return self._insert_directly(store, batches, partition)
            stage = stage_name(self.write_id, partition, attempt)
            rows, null_keys = self._stage(store, batches, self.write_id, stage, partition)
        finally:
            store.close()
        return StagedPart(partition, stage if rows else None, rows, null_keys=null_keys)

    def _insert_directly(
        self, store: SparkStorage, batches: Iterator[pa.RecordBatch], partition: int
    ) -> InsertedPart:
        """Enqueue batch by batch; skip what an earlier attempt of this partition enqueued."""
        done = store.bulk_progress(self.write_id, partition)
        seen = 0  # rows of the input so far
        checksum = 0  # of the rows so far
        keyless = 0
        for batch in batches:
            jobs = prepare(batch, self.plan, Where(partition, seen))
            null_keys = jobs.null_keys(self.plan)
            if null_keys and self.plan.null_keys == "refuse":
                # Each batch commits on its own: the batches before this one stay.
                where = f"of a batch of partition {partition} (from row {seen}) "
                raise RowError(null_key_refusal(self.plan.columns["key"], null_keys, where))
            prints = jobs.fingerprints()
            start = seen
            seen += len(jobs)
            if seen <= done.rows:
                checksum = (checksum + sum(prints)) % _CHECKSUM_MODULUS
                if seen == done.rows:
                    _check_retry(self.write_id, partition, done, checksum)
                continue
            skip = max(0, done.rows - start)
            if skip:
                checksum = (checksum + sum(prints[:skip])) % _CHECKSUM_MODULUS
                _check_retry(self.write_id, partition, done, checksum)
            keyless += jobs.key[skip:].count(None) if null_keys else 0
            expected = Progress(start + skip, _signed(checksum))
            checksum = (checksum + sum(prints[skip:])) % _CHECKSUM_MODULUS
            after = Progress(seen, _signed(checksum))
            step = BatchStep(self.write_id, partition, expected, after)
            rows = staged_rows(store, jobs, skip)
            store.bulk_insert(step, rows, self.plan.unique, datetime.now(UTC))
        if seen < done.rows:
            raise WriteConflictError(
                f"partition {partition} of write {self.write_id}: an earlier attempt enqueued "
                f"{done.rows} rows, this one was given {seen}: the DataFrame is not "
                "deterministic; use an atomic write"
            )
        return InsertedPart(partition, seen, keyless)


def _check_same_options(write_id: str, kept: str | None, given: str) -> None:
    """A rerun under a committed writeId must be the same write: refuse other options."""
    if kept is None:
        return  # committed before options were kept
    before, now = json.loads(kept), json.loads(given)
    changes = [
        f"{name} was {_shown(before.get(name))}, now {_shown(now.get(name))}"
        for name in sorted(set(before) | set(now), key=str.lower)
        if before.get(name) != now.get(name)
    ]
    if changes:
        raise ConfigurationError(
            f"writeId {write_id!r} was committed before with other options ({'; '.join(changes)})"
            ": a rerun under a writeId must be the same write. Give this write a new writeId, "
            "or the options of the first to rerun it (it then enqueues nothing)"
        )


def _shown(value: str | None) -> str:
    return "not given" if value is None else repr(value)


def _signed(value: int) -> int:
    return value - _CHECKSUM_MODULUS if value >= 2**63 else value


def _check_retry(write_id: str, partition: int, done: Progress, checksum: int) -> None:
    if _signed(checksum) != done.checksum:
        raise WriteConflictError(
            f"partition {partition} of write {write_id}: a failed attempt enqueued its first "
            f"{done.rows} rows, and the retry was given other rows first (the partition's "
            "order is not deterministic, e.g. after a shuffle). To never enqueue a row twice "
            "the write stops here; use an atomic write, or sortWithinPartitions before it"
        )


class ConveyorStreamWriter(_Staging, DataSourceStreamArrowWriter):
    """The streaming sink: each micro-batch an atomic write, enqueued once across restarts."""

    def __init__(self, dsn: str, plan: WritePlan) -> None:
        self.dsn = dsn
        self.plan = plan
        store = open_storage(dsn)
        try:
            check_tables(store, plan)
        finally:
            store.close()

    @staticmethod
    def _write_id(query: str, batch: int) -> str:
        return f"stream:{query}:{batch}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition, attempt, context = _task_context()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if query is None or batch_id is None:
            raise RuntimeError("the conveyor streaming sink runs only inside a streaming query")
        write_id = self._write_id(query, int(batch_id))
        store = open_storage(self.dsn)
        try:
            store.bulk_write_touch(write_id, datetime.now(UTC))
            stage = stage_name(write_id, partition, attempt)
            rows, null_keys = self._stage(
                store, _rebatch(iterator, self.plan.batch_size), write_id, stage, partition
            )
        finally:
            store.close()
        return StagedPart(partition, stage if rows else None, rows, query, null_keys)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        parts = [m for m in messages if isinstance(m, StagedPart)]
        query = next((m.query for m in parts if m.query), None)
        if query is None:
            return  # no task ran: nothing was staged, nothing to record
        stages = [m.stage for m in sorted(parts, key=lambda m: m.partition) if m.stage]
        write_id = self._write_id(query, batchId)
        store = open_storage(self.dsn)
        try:
            keyless = self._refuse_null_keys(store, write_id, parts)
            commit = WriteCommit(
                write_id,
                stages,
                self.plan.unique,
                datetime.now(UTC),
                f"stream:{query}",
                batchId,
                pieces=self.plan.commit_pieces,
                keyless=keyless,
            )
            result = store.bulk_write_commit(commit)
        finally:
            store.close()
        if result.new:
            driver_log().info(
                "conveyor streaming sink, query %s, micro-batch %s committed; the query so far: %s",
                query,
                batchId,
                describe(result),
            )
        else:
            driver_log().info(
                "conveyor streaming sink, query %s, micro-batch %s was committed before "
                "(Spark ran it again after a restart): enqueued nothing",
                query,
                batchId,
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query = next((m.query for m in messages if isinstance(m, StagedPart) and m.query), None)
        if query is None:
            return  # what failed tasks staged is cleared as abandoned later
        store = open_storage(self.dsn)
        try:
            store.bulk_write_abort(self._write_id(query, batchId))
        finally:
            store.close()


def staged_rows(store: SparkStorage, jobs: JobColumns, skip: int = 0) -> Any:
    """A batch of jobs in the form the store stages: row tuples, or CSV for COPY."""
    if store.stage_format == "rows":
        rows = jobs.rows()
        return rows[skip:] if skip else rows
    return _csv(jobs, skip)


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


def _csv(jobs: JobColumns, skip: int = 0) -> bytes:
    """The batch as CSV for COPY, written by Arrow's C++ writer (not row by row in Python).

    Arrow quotes every string and leaves nulls unquoted and empty, which is
    exactly how PostgreSQL's CSV tells an empty string from NULL.
    """
    import pyarrow.csv as pacsv

    table = pa.Table.from_arrays(
        [
            pa.array(jobs.queue[skip:], pa.string()),
            pa.array(jobs.task[skip:], pa.string()),
            pa.array(jobs.args[skip:], pa.string()),
            pa.array(jobs.kwargs[skip:], pa.string()),
            pa.array(jobs.priority[skip:], pa.int32()),
            pa.array(jobs.run_at[skip:], pa.float64()),
            pa.array(jobs.max_attempts[skip:], pa.int32()),
            pa.array(jobs.key[skip:], pa.string()),
            pa.array(jobs.group[skip:], pa.string()),
            pa.array(jobs.batch[skip:], pa.string()),
        ],
        schema=_CSV_SCHEMA,
    )
    out = io.BytesIO()
    pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False))
    return out.getvalue()
