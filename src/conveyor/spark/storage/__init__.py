"""The Spark layer's storage: its writes, scans and event stream, in its own tables.

A DataFrame write goes through staging: each task appends its rows to a
staging table of its own (``bulk_stage``), and the write's commit moves the
staged rows into ``jobs`` by the same rules as every other enqueue
(``bulk_write_commit``): in one transaction, or on PostgreSQL in parallel
pieces committed together (``pieces.py``). A non-atomic write moves each batch
as it goes (``bulk_insert``), recording how far each partition got so that a
retried task never enqueues a row twice. Reads scan a table by id range (``scan``) and
follow the event log (``event_stream_*``).

Each database has a module here (``sqlite.py``, ``postgres.py``): it holds a
store, whose public session (``store.session()``) lends its connections, its
write lock and its migrations, and whose statements of an enqueue it includes,
with the Spark layer's own statements in a file beside it
(``sqlite.sql``, ``postgres.sql``). Spark's tables (``spark_writes``,
``spark_write_results``, ``spark_write_progress``, the staging tables) are the
Spark layer's: made by its own line of migrations (``migrations/<database>/``,
recorded in ``spark_schema_migrations``) the first time it writes, so a
database that never ran a Spark write has none of them.

Nothing here imports Spark or pyarrow; the staged rows and scanned chunks are
plain Python data (see ``stage_format`` and ``scan``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.spark.storage.scan import (
    SCAN_ID_COLUMN,
    TIME_COLUMNS,
    Scan,
    ScanFilter,
    ScanOp,
    ScanRange,
    check_columns,
    scan_query,
)
from conveyor.store.dsn import check_postgres_dsn, sqlite_path
from conveyor.store.records import EventOffset

__all__ = [
    "PATH_ONE_TRANSACTION",
    "PATH_PER_PARTITION",
    "PATH_PIECES",
    "REDIS_REFUSAL",
    "SCAN_ID_COLUMN",
    "TIME_COLUMNS",
    "BatchStep",
    "Cleanup",
    "InsertCounts",
    "PieceFailedError",
    "Progress",
    "Scan",
    "ScanFilter",
    "ScanOp",
    "ScanRange",
    "SparkStorage",
    "Unique",
    "WriteCommit",
    "WriteConflictError",
    "WriteEndedError",
    "WriteResult",
    "WriteRow",
    "backend_of",
    "check_columns",
    "no_core_tables",
    "open_storage",
    "quote_ident",
    "scan_query",
    "stage_name",
    "stage_prefix",
    "token_stage_prefix",
    "write_token",
]

STAGE_PREFIX = "spark_stage_"
Unique = Literal["live", "forever"]


class WriteEndedError(ConveyorError):
    """The write was already committed or aborted: a late task must not add to it."""


class WriteConflictError(ConveyorError):
    """Two attempts of one partition of a non-atomic write ran into each other."""


class PieceFailedError(ConveyorError):
    """A piece of a parallel commit failed: every piece was rolled back, nothing was enqueued."""


def stage_prefix(write_id: str) -> str:
    """The start of the names of a write's staging tables.

    A hash of the write's id: ids may hold any text (a caller's ``writeId``),
    table names may not, and a fixed length means no prefix is another's.
    """
    return token_stage_prefix(write_token(write_id))


def token_stage_prefix(token: str) -> str:
    """The start of the names of the staging tables of the write with this token."""
    return f"{STAGE_PREFIX}{token}_"


def write_token(write_id: str) -> str:
    """A write's id as 16 hex digits: its staging tables' and its commit's name."""
    return hashlib.sha1(write_id.encode()).hexdigest()[:16]


def stage_name(write_id: str, partition: int, attempt: int) -> str:
    """The staging table of one task attempt of a write."""
    return f"{stage_prefix(write_id)}{int(partition)}_{int(attempt)}"


def quote_ident(name: str) -> str:
    """Quote an identifier this module made (checked, never user text)."""
    if not name.replace("_", "").isalnum() or not name.isascii():
        raise ValueError(f"not a plain identifier: {name!r}")
    return f'"{name}"'


@dataclass(frozen=True, slots=True)
class WriteCommit:
    """What ``bulk_write_commit`` moves: the staged rows of ``stages`` of a write,
    under ``unique``'s rule, recorded as ``result_id`` (with ``batch``, a
    streaming micro-batch), at ``now``."""

    write_id: str
    stages: Sequence[str]
    unique: Unique
    now: datetime
    result_id: str
    batch: int | None = None
    #: On PostgreSQL, up to this many transactions at once (pieces.py).
    pieces: int = 1
    #: Rows of the write with a null key (added to the result).
    keyless: int = 0

    def result(self, given: int, enqueued: int, path: str) -> WriteResult:
        """What this commit did: of ``given`` rows, ``enqueued`` became jobs (the
        others' keys were held), by ``path``."""
        return WriteResult(
            self.result_id, self.batch, self.now, given, enqueued, given - enqueued,
            self.keyless, path,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a committed write did, as the store recorded it."""

    id: str
    #: A streaming sink: the last micro-batch committed (counts add up all of them).
    batch: int | None
    committed_at: datetime
    #: Rows the write was given.
    rows: int
    #: Jobs it created.
    enqueued: int
    #: Rows left out because a job of their queue held their key (see ``unique``).
    skipped: int
    #: Rows whose key column was null, enqueued without a key (option ``nullKeys``).
    keyless: int = 0
    #: How the write committed: "pieces" (parallel pieces committed together), "one
    #: transaction", or "per partition" (atomic false: each batch on its own).
    path: str = ""
    #: False when this commit found the write (or the micro-batch) committed
    #: before, and moved nothing.
    new: bool = True


@dataclass(frozen=True, slots=True)
class WriteRow:
    """One write as ``conveyor spark writes`` lists it."""

    id: str
    #: "committed", "running" (open), "abandoned" (open longer than allowed) or
    #: "stalled" (its committer died with pieces prepared: see pieces.py).
    state: str
    #: When it committed, or (open) when it started.
    at: datetime
    rows: int | None
    enqueued: int | None
    skipped: int | None


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What ``bulk_write_cleanup`` did."""

    #: Writes cleared as abandoned (their staged rows dropped; none became jobs).
    cleared: list[str]
    #: Results of past writes purged.
    purged: int
    #: Writes whose committer died while their pieces were prepared (PostgreSQL's
    #: parallel commits): the pieces were committed (the write had decided) or
    #: rolled back and the write ended (it had not).
    settled: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far one partition of a non-atomic write has got."""

    rows: int
    #: Sum of the row hashes of those rows, modulo 2**64 (as a signed 64-bit integer).
    checksum: int


@dataclass(frozen=True, slots=True)
class BatchStep:
    """One batch of a non-atomic write (``bulk_insert``): it moves partition
    ``part``'s progress from ``expected`` to ``after``."""

    write_id: str
    part: int
    expected: Progress
    after: Progress

    def check(self, current: Progress) -> None:
        """Raise WriteConflictError unless the partition is where this batch expects."""
        if current != self.expected:
            raise WriteConflictError(
                f"partition {self.part} of write {self.write_id}: expected "
                f"{self.expected.rows} rows enqueued before this batch, found {current.rows}: "
                "another attempt of this partition is writing"
            )

    def advance_params(self, given: int, enqueued: int) -> dict[str, Any]:
        """The parameters of ``spark_progress_advance``: of ``given`` rows, ``enqueued``
        became jobs."""
        return {
            "write_id": self.write_id,
            "part": self.part,
            "row_count": self.after.rows,
            "checksum": self.after.checksum,
            "enqueued": enqueued,
            "skipped": given - enqueued,
        }


@dataclass(frozen=True, slots=True)
class InsertCounts:
    enqueued: int
    skipped: int


class SparkStorage(Protocol):
    """What the Spark data source asks of a database: the same on SQLite and PostgreSQL."""

    description: str
    #: What ``bulk_stage`` and ``bulk_insert`` take: "rows" (a sequence of
    #: 10-tuples: queue, task, args, kwargs, priority, run_at epoch seconds or
    #: None, max_attempts, key, group, batch) or "csv" (those rows as CSV bytes).
    stage_format: Literal["rows", "csv"]

    def migrate(self) -> int:
        """Bring the store's own schema up to date (its tables: jobs, events, ...)."""
        ...

    def schema_version(self) -> int:
        """The version of the store's own schema, 0 on a database without conveyor's tables."""
        ...

    def spark_migrate(self) -> int:
        """Make or update Spark's tables (its own line of migrations); return its version.

        The database must have conveyor's tables (``SchemaMissingError`` if
        not). Cheap when nothing is pending: one read, no lock.
        """
        ...

    def spark_schema_version(self) -> int:
        """The version of Spark's tables, 0 when no Spark write ever made them (no change)."""
        ...

    def close(self) -> None: ...

    def bulk_write_open(
        self,
        write_id: str,
        now: datetime,
        abandoned_before: datetime,
        result_id: str | None = None,
    ) -> list[str]:
        """Open a write; first clear writes opened before ``abandoned_before`` (their ids).

        ``result_id``: the caller's id of the write, shown while it is open.
        """
        ...

    def bulk_write_list(self, limit: int, abandoned_before: datetime) -> list[WriteRow]:
        """Past and open writes, newest first; open before ``abandoned_before``: abandoned."""
        ...

    def bulk_write_cleanup(
        self, abandoned_before: datetime, results_before: datetime | None
    ) -> Cleanup:
        """Clear writes opened before ``abandoned_before``; purge results older than the other.

        Writes are named by the caller's writeId, else the id of the run.
        """
        ...

    def bulk_write_describe(self, result_id: str, options: str) -> None:
        """Keep the options a committed write was made with (the first commit's stay)."""
        ...

    def bulk_write_options(self, result_id: str) -> str | None:
        """The options kept for a committed write (None: none kept, or no such write)."""
        ...

    def bulk_write_touch(self, write_id: str, now: datetime) -> None:
        """Open a write if it is not open, or mark it alive (a streaming micro-batch's tasks)."""
        ...

    def bulk_stage(self, write_id: str, stage: str, rows: Any, *, create: bool) -> None:
        """Append rows to a staging table (created first when ``create``), while the write is open.

        Raises WriteEndedError when the write was committed or aborted.
        """
        ...

    def bulk_write_commit(self, commit: WriteCommit) -> WriteResult:
        """Move the staged rows into jobs, record the result, end the write and drop its staging.

        All or nothing: one transaction, or on PostgreSQL up to ``pieces``
        transactions at once, prepared and then committed together (pieces.py).
        When ``result_id`` was recorded before (a rerun with the same write id;
        with ``batch``, a streaming micro-batch at or below the last one
        committed), nothing is moved and that result is returned with ``new``
        false. The result's ``path`` says whether it committed in pieces or one
        transaction.
        """
        ...

    def bulk_write_abort(self, write_id: str) -> None:
        """End the write and drop whatever its tasks staged (none of it becomes a job)."""
        ...

    def bulk_progress(self, write_id: str, part: int) -> Progress:
        """How far a partition of a non-atomic write got (zero when it has not started)."""
        ...

    def bulk_insert(
        self, step: BatchStep, rows: Any, unique: Unique, now: datetime
    ) -> InsertCounts:
        """Enqueue one batch of a non-atomic write in one transaction, advancing its progress.

        Raises WriteEndedError when the write ended, and WriteConflictError when
        the partition's progress is no longer the step's ``expected`` (another
        attempt of the partition moved it).
        """
        ...

    def bulk_write_finish(
        self, write_id: str, now: datetime, result_id: str, keyless: int = 0
    ) -> WriteResult:
        """End a non-atomic write: record the sum of its partitions' counts.

        When ``result_id`` was recorded before (another run with the same id
        committed meanwhile), the counts are added to it.
        """
        ...

    def bulk_write_result(self, result_id: str) -> WriteResult | None: ...

    def scan_id_bounds(self, table: str) -> tuple[int | None, int | None]: ...

    def scan(self, what: ScanRange, chunk_rows: int) -> Scan:
        """The rows ``what`` names, in id order, in chunks of about ``chunk_rows``."""
        ...

    def event_stream_end(self, after: EventOffset, limit: int | None, floor: int) -> EventOffset:
        """Where a micro-batch of at most ``limit`` events after ``after`` ends (``after``: none).

        Only events with ``seq >= floor`` count. See the stream reader for the
        meaning of an offset on each backend.
        """
        ...

    def event_stream_read(
        self, after: EventOffset, until: EventOffset, columns: Sequence[str], floor: int
    ) -> Generator[list[tuple[Any, ...]], None, None]:
        """The events after ``after`` up to ``until`` (and ``seq >= floor``), in chunks of rows."""
        ...

    def event_first_seq_since(self, at: datetime) -> int | None:
        """The seq of the first event recorded at ``at`` or later, None when there is none."""
        ...


def no_core_tables(description: str) -> str:
    """Why Spark's tables are not made on a database without conveyor's own."""
    return (
        f"{description} lacks conveyor's tables: run `conveyor migrate` (or app.migrate()) "
        "first; Spark's tables are made on top of them by the first Spark write"
    )


#: The ways a write commits (WriteResult.path).
PATH_PIECES = "pieces"
PATH_ONE_TRANSACTION = "one transaction"
PATH_PER_PARTITION = "per partition"


#: Why the Spark data source refuses a Redis DSN (docs/redis.md: what each store supports).
REDIS_REFUSAL = (
    "the Spark data source needs SQLite or PostgreSQL: its writes stage rows in tables "
    "and its reads split jobs by id range with filters pushed down, which Redis cannot do. "
    "On Redis, enqueue with app.enqueue_many / Task.enqueue_many and read with app.jobs()"
)
_DSN_HINT = (
    "the conveyor data source needs option dsn = sqlite:///path.db or "
    "postgresql://user@host:port/dbname"
)


def backend_of(dsn: str) -> Literal["sqlite", "postgres"]:
    """Which backend a DSN names, checked (a malformed DSN raises, saying what to write)."""
    scheme = dsn.split(":", 1)[0].lower() if ":" in dsn else ""
    if scheme == "sqlite":
        sqlite_path(dsn)
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        check_postgres_dsn(dsn)
        return "postgres"
    if scheme in ("redis", "rediss", "unix"):
        raise ConfigurationError(REDIS_REFUSAL)
    raise ConfigurationError(_DSN_HINT)


def open_storage(dsn: str) -> SparkStorage:
    """The Spark storage of a DSN, not migrated (the write's driver migrates, once)."""
    if backend_of(dsn) == "sqlite":
        from conveyor.spark.storage.sqlite import SQLiteSparkStorage

        return SQLiteSparkStorage(sqlite_path(dsn), migrate=False)
    try:
        from conveyor.spark.storage.postgres import PostgresSparkStorage
    except ImportError as exc:
        raise ConfigurationError(
            f"PostgreSQL support needs psycopg 3: pip install 'conveyor[postgres]' ({exc})"
        ) from None
    return PostgresSparkStorage(dsn)
