"""What Spark's storage does the same way on both SQL databases, written once.

``SQLSparkStorage`` holds a store and carries the methods whose statements
and steps are the same in both dialects: the store's own schema, the version
of Spark's tables, staging a batch, touching, aborting and clearing writes,
the options and progress of writes, the list of writes an operator sees, the
id bounds of a scan and the reads of the event stream. A database's storage
(``sqlite.py``, ``postgres.py``) says how it reads (``_reading``), how it
changes in one transaction (``_changing``), how it writes staged rows
(``_stage_rows``), how it bounds the event stream (``_stream_range``), how a
time goes in and comes out, and which statement files it reads (``_Q``,
``_OPS``); the rest of its methods are its own, where the dialects differ (the
move, pieces, the end of the event stream).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol

from conveyor.errors import ConfigurationError, SchemaMissingError
from conveyor.spark.storage import (
    PATH_PER_PARTITION,
    SCAN_ID_COLUMN,
    Cleanup,
    Progress,
    WriteEndedError,
    WriteResult,
    WriteRow,
    check_columns,
    no_core_tables,
    quote_ident,
    stage_prefix,
)
from conveyor.spark.storage.scan import SCAN_COLUMNS
from conveyor.store.records import EventOffset
from conveyor.store.sql import Migration


class _Store(Protocol):
    """What the storage asks of the store it holds (SQLiteStore and PostgresStore both)."""

    description: str

    def migrate(self) -> int: ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...


class _Session(Protocol):
    """What the storage asks of the store's session (store.session())."""

    def apply_migrations(
        self, conn: Any, migrations: Sequence[Migration], version: str, record: str
    ) -> int: ...


class SQLSparkStorage:
    """The dialect-neutral part of ``SparkStorage`` on a SQL store (see the module)."""

    stage_format: Literal["rows", "csv"]
    #: The dialect's named statements (``sqlite.sql`` or ``postgres.sql``) and operations.
    _Q: ClassVar[dict[str, str]]
    _OPS: ClassVar[dict[str, str]]
    #: The dialect's line of migrations of Spark's tables.
    _MIGRATIONS: ClassVar[list[Migration]]

    store: _Store
    _db: _Session
    description: str

    # --- what each database says ----------------------------------------------------

    @abstractmethod
    def _reading(self) -> AbstractContextManager[Any]:
        """A connection for reads and single statements, each committing on its own."""

    @abstractmethod
    def _changing(self) -> AbstractContextManager[Any]:
        """A connection in one transaction (SQLite: under the write lock)."""

    @staticmethod
    @abstractmethod
    def _time(value: datetime) -> Any:
        """A time as the database's statements take it."""

    @staticmethod
    @abstractmethod
    def _time_back(value: Any) -> datetime:
        """A time as the database's statements give it back."""

    @abstractmethod
    def _stream_range(self, after: EventOffset, until: EventOffset, floor: int) -> dict[str, Any]:
        """The parameters of ``event_stream_read``: the events after ``after`` up to
        ``until``, none below the sequence ``floor``."""

    #: What the database raises when a write opens under an id that is open already.
    _OPEN_ALREADY: ClassVar[type[Exception]]

    @abstractmethod
    def _stage_rows(self, conn: Any, table: str, rows: Any) -> None:
        """Write a batch of rows (as ``stage_format`` says) into the staging ``table``."""

    def _settle(self) -> list[str]:
        """Finish what commits whose committer died left; their names.

        Nothing by default: only PostgreSQL's parallel commits leave such work.
        """
        return []

    def _lock_migrations(self, conn: Any) -> None:
        """Take the lock under which one driver at a time migrates Spark's tables.

        Nothing by default: SQLite's write transaction is that lock already.
        """

    # --- the store's own schema -----------------------------------------------------

    def migrate(self) -> int:
        return self.store.migrate()

    def schema_version(self) -> int:
        return self.store.schema_version()

    def close(self) -> None:
        self.store.close()

    # --- Spark's tables and writes ----------------------------------------------------

    def spark_schema_version(self) -> int:
        # Reads only: creating the table here could race a concurrent spark_migrate().
        with self._reading() as conn:
            exists = conn.execute(self._Q["spark_migrations_exist"]).fetchone()
            if not exists or not exists[0]:
                return 0
            row = conn.execute(self._Q["spark_schema_version"]).fetchone()
            return int(row[0]) if row else 0

    def spark_migrate(self) -> int:
        current = self.spark_schema_version()
        if current >= self._MIGRATIONS[-1].version:
            return current  # nothing pending: one read, no lock
        if self.schema_version() == 0:
            raise SchemaMissingError(no_core_tables(self.description))
        with self._changing() as conn:
            # Two drivers starting together migrate once: the second finds it done.
            self._lock_migrations(conn)
            conn.execute(self._Q["spark_migrations_table"])
            return self._db.apply_migrations(
                conn,
                self._MIGRATIONS,
                self._Q["spark_schema_version"],
                self._Q["spark_migration_record"],
            )

    def bulk_write_open(
        self,
        write_id: str,
        now: datetime,
        abandoned_before: datetime,
        result_id: str | None = None,
    ) -> list[str]:
        settled = self._settle()
        with self._changing() as conn:
            cleared = settled + self._clear_abandoned(conn, abandoned_before)
            params = {"id": write_id, "now": self._time(now), "result_id": result_id}
            try:
                conn.execute(self._Q["spark_write_open"], params)
            except self._OPEN_ALREADY:
                raise ConfigurationError(running(write_id)) from None
        return cleared

    def bulk_stage(self, write_id: str, stage: str, rows: Any, *, create: bool) -> None:
        table = stage_table(write_id, stage)
        # One short transaction per batch, not one for the task: SQLite has one
        # writer, and the other tasks stage at the same time.
        with self._changing() as conn:
            check_open(conn, self._Q["spark_write_is_open"], write_id)
            if create:
                conn.execute(self._Q["spark_stage_create"].format(stage=table))
            self._stage_rows(conn, table, rows)

    def bulk_write_abort(self, write_id: str) -> None:
        self._settle()  # a commit that failed half-way left pieces: decided ones stay
        with self._changing() as conn:
            self._end_write(conn, write_id)

    def bulk_write_cleanup(
        self, abandoned_before: datetime, results_before: datetime | None
    ) -> Cleanup:
        settled = self._settle()
        with self._changing() as conn:
            cleared = self._clear_abandoned(conn, abandoned_before)
            purged = 0
            if results_before is not None:
                params = {"before": self._time(results_before)}
                purged = conn.execute(self._OPS["spark_write_results_purge"], params).rowcount
        return Cleanup(cleared, max(purged, 0), settled)

    def _clear_abandoned(self, conn: Any, before: datetime) -> list[str]:
        """Close writes whose driver died, and drop what they staged: none of it became jobs.

        Called after ``_settle``, so that no write it closes has pieces left.
        """
        params = {"before": self._time(before)}
        rows = conn.execute(self._Q["spark_write_abandoned"], params).fetchall()
        for write_id, _ in rows:
            self._end_write(conn, write_id)
        return [str(shown) for _, shown in rows]

    def _end_write(self, conn: Any, write_id: str) -> None:
        """End a write in this transaction: none of what it staged becomes a job."""
        conn.execute(self._Q["spark_write_close"], {"id": write_id})
        conn.execute(self._Q["spark_progress_delete"], {"write_id": write_id})
        self._drop_stages(conn, stage_prefix(write_id))

    def _drop_stages(self, conn: Any, prefix: str) -> None:
        """Drop every staging table under ``prefix`` (a write's: with those of the attempts
        Spark discarded)."""
        # fetchall: SQLite cannot drop a table while a cursor reads the schema.
        tables = conn.execute(self._Q["spark_stage_tables"], {"prefix": prefix}).fetchall()
        for (table,) in tables:
            conn.execute(self._Q["spark_stage_drop"].format(stage=quote_ident(table)))

    def bulk_write_touch(self, write_id: str, now: datetime) -> None:
        with self._changing() as conn:
            conn.execute(self._Q["spark_write_touch"], {"id": write_id, "now": self._time(now)})

    def bulk_progress(self, write_id: str, part: int) -> Progress:
        with self._reading() as conn:
            row = conn.execute(
                self._Q["spark_progress_get"], {"write_id": write_id, "part": part}
            ).fetchone()
        return Progress(0, 0) if row is None else Progress(int(row[0]), int(row[1]))

    def bulk_write_list(self, limit: int, abandoned_before: datetime) -> list[WriteRow]:
        params = {"limit": limit, "abandoned_before": self._time(abandoned_before)}
        with self._reading() as conn:
            rows = conn.execute(self._OPS["spark_write_list"], params).fetchall()
        return [
            WriteRow(id_, state, self._time_back(at), count, enqueued, skipped)
            for id_, state, at, count, enqueued, skipped in rows
        ]

    def bulk_write_describe(self, result_id: str, options: str) -> None:
        with self._changing() as conn:
            conn.execute(self._OPS["spark_write_describe"], {"id": result_id, "options": options})

    def bulk_write_finish(
        self, write_id: str, now: datetime, result_id: str, keyless: int = 0
    ) -> WriteResult:
        with self._changing() as conn:
            if conn.execute(self._Q["spark_write_close"], {"id": write_id}).rowcount != 1:
                raise WriteEndedError(f"write {write_id} was already committed or aborted")
            totals = conn.execute(self._Q["spark_progress_totals"], {"write_id": write_id})
            given, enqueued, skipped = totals.fetchone() or (0, 0, 0)
            self._record_result(
                conn,
                WriteResult(
                    result_id, None, now, given, enqueued, skipped, keyless, PATH_PER_PARTITION
                ),
            )
            conn.execute(self._Q["spark_progress_delete"], {"write_id": write_id})
            result = self._result(conn, result_id)
        assert result is not None
        return result

    def bulk_write_result(self, result_id: str) -> WriteResult | None:
        with self._reading() as conn:
            return self._result(conn, result_id)

    def _result(self, conn: Any, result_id: str) -> WriteResult | None:
        return write_result(conn, self._Q["spark_write_result_get"], result_id, self._time_back)

    def _record_result(self, conn: Any, result: WriteResult) -> None:
        """Record what a write did, committed at its ``committed_at``."""
        params = {
            "id": result.id,
            "batch": result.batch,
            "now": self._time(result.committed_at),
            "row_count": result.rows,
            "enqueued": result.enqueued,
            "skipped": result.skipped,
            "keyless": result.keyless,
            "path": result.path,
        }
        conn.execute(self._Q["spark_write_result_record"], params)

    def bulk_write_options(self, result_id: str) -> str | None:
        with self._reading() as conn:
            row = conn.execute(self._OPS["spark_write_options"], {"id": result_id}).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    # --- reads ------------------------------------------------------------------------

    def scan_id_bounds(self, table: str) -> tuple[int | None, int | None]:
        check_columns(table, [], SCAN_COLUMNS.get(table, ()))
        sql = self._Q["scan_id_bounds"].format(id=SCAN_ID_COLUMN[table], table=table)
        with self._reading() as conn:
            row = conn.execute(sql).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def event_stream_read(
        self, after: EventOffset, until: EventOffset, columns: Sequence[str], floor: int
    ) -> Generator[list[tuple[Any, ...]], None, None]:
        check_columns("events", columns, SCAN_COLUMNS["events"])
        sql = self._Q["event_stream_read"].format(columns=", ".join(columns) or "1")
        with self._reading() as conn:
            cursor = conn.execute(sql, self._stream_range(after, until, floor))
            try:
                while rows := cursor.fetchmany(10_000):
                    yield rows
            finally:
                cursor.close()

    def event_first_seq_since(self, at: datetime) -> int | None:
        with self._reading() as conn:
            row = conn.execute(self._Q["event_first_seq_since"], {"at": self._time(at)}).fetchone()
        return None if row is None or row[0] is None else int(row[0])


def running(write_id: str) -> str:
    """Why a write cannot open under an id that is open already."""
    return (
        f"a write with id {write_id!r} is open: another write with this id is running, or "
        "one died without ending (it is cleared once abandonedAfterHours have passed); "
        "choose another writeId"
    )


def stage_table(write_id: str, stage: str) -> str:
    """A task's staging table, quoted, once checked to be one of the write's."""
    if not stage.startswith(stage_prefix(write_id)):
        raise ValueError(f"staging table {stage!r} is not one of write {write_id}")
    return quote_ident(stage)


def check_open(conn: Any, statement: str, write_id: str) -> None:
    """Raise WriteEndedError unless the write is open (``statement``: spark_write_is_open)."""
    if conn.execute(statement, {"id": write_id}).fetchone() is None:
        raise WriteEndedError(f"write {write_id} was committed or aborted before this task")


def write_result(
    conn: Any, statement: str, result_id: str, time_back: Callable[[Any], datetime]
) -> WriteResult | None:
    """The result recorded as ``result_id`` (``statement``: spark_write_result_get), if any;
    ``time_back`` reads the database's time."""
    row = conn.execute(statement, {"id": result_id}).fetchone()
    if row is None:
        return None
    id_, batch, committed_at, rows, enqueued, skipped, keyless, path = row
    return WriteResult(
        id_, None if batch is None else int(batch), time_back(committed_at), int(rows),
        int(enqueued), int(skipped), int(keyless), path or "",
    )  # fmt: skip
