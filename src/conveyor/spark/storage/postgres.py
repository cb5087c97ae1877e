"""The Spark layer's storage on PostgreSQL: ``SparkStorage`` on a PostgreSQL store it holds.

It reaches the store's pool, transactions and migrations through the store's
public session (``PostgresStore.session()``), never its private members.

Staged rows arrive as CSV for ``COPY`` (the fastest way in); the move into
``jobs`` ends with ``job_insert_rules``, the store's statement text that ends
``job_insert`` (included into ``postgres.sql``), so keys, events and the
wake-up of workers follow one rule. Scans come out through ``COPY ... TO
STDOUT`` as CSV: building a Python object per value through psycopg was the
bottleneck of a read.

Each storage keeps a pool of one or two connections: a Spark task opens one,
does its part, and closes it.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg import errors as pg_errors

from conveyor.spark.storage import (
    PATH_ONE_TRANSACTION,
    PATH_PIECES,
    TIME_COLUMNS,
    BatchStep,
    InsertCounts,
    Progress,
    Scan,
    ScanRange,
    Unique,
    WriteCommit,
    WriteEndedError,
    WriteResult,
    WriteRow,
    quote_ident,
    scan_query,
    stage_prefix,
    token_stage_prefix,
    write_token,
)
from conveyor.spark.storage import pieces as parallel
from conveyor.spark.storage.common import (
    SQLSparkStorage,
    check_open,
    stage_table,
    write_result,
)
from conveyor.spark.storage.scan import SCAN_COLUMNS
from conveyor.store.postgres.session import PostgresSession
from conveyor.store.postgres.store import PostgresStore
from conveyor.store.records import EventOffset
from conveyor.store.sql import load_migrations, load_queries

_Q = load_queries("conveyor.spark.storage", "postgres.sql")
#: What an operator does with Spark's writes: list, clean up, purge.
_OPS = load_queries("conveyor.spark.storage", "operations.sql", pyformat=True)
_MIGRATIONS = load_migrations("conveyor.spark.storage", "migrations/postgres")
#: The temporary table a non-atomic write stages each batch in (one per connection).
_DIRECT = "spark_direct"
_COPY_CHUNK_BYTES = 1 << 20
_JSON_COLUMNS = frozenset({"args", "kwargs", "result", "headers"})

Connection = psycopg.Connection[tuple[Any, ...]]


class PostgresSparkStorage(SQLSparkStorage):
    """Spark's storage on a PostgreSQL store it holds, through the store's public session."""

    stage_format: Literal["rows", "csv"] = "csv"
    _Q = _Q
    _OPS = _OPS
    _MIGRATIONS = _MIGRATIONS
    _OPEN_ALREADY = pg_errors.UniqueViolation

    def __init__(self, dsn: str, **options: Any) -> None:
        options.setdefault("min_size", 1)
        options.setdefault("max_size", 2)
        self.store = PostgresStore(dsn, **options)
        self._db: PostgresSession = self.store.session()
        self.dsn = dsn
        self.description = self.store.description

    def _reading(self) -> AbstractContextManager[Connection]:
        return self._db.connection()

    def _changing(self) -> AbstractContextManager[Connection]:
        return self._db.transaction()

    @staticmethod
    def _time(value: datetime) -> datetime:
        return value

    @staticmethod
    def _time_back(value: Any) -> datetime:
        assert isinstance(value, datetime)  # timestamptz: psycopg gives a datetime
        return value

    def _stream_range(self, after: EventOffset, until: EventOffset, floor: int) -> dict[str, Any]:
        return {
            "after_xid": after[0],
            "after_seq": after[1],
            "until_xid": until[0],
            "until_seq": until[1],
            "floor": floor,
        }

    def _lock_migrations(self, conn: Connection) -> None:
        conn.execute(_Q["spark_migrations_lock"])

    # --- writes -----------------------------------------------------------------

    def _stage_rows(self, conn: Connection, table: str, rows: Any) -> None:
        with conn.cursor().copy(_Q["spark_stage_copy"].format(stage=table)) as copy:
            copy.write(rows)

    def bulk_write_commit(self, commit: WriteCommit) -> WriteResult:
        write_id, result_id, now = commit.write_id, commit.result_id, commit.now
        tables = [stage_table(write_id, s) for s in commit.stages]
        pieces = min(commit.pieces, len(tables))
        if pieces > 1:
            with self._db.connection() as conn:
                pieces = min(pieces, parallel.room(conn))
        if pieces > 1:
            return self._commit_in_pieces(commit, tables, pieces)
        with self._db.transaction() as conn:
            done = _close_write(conn, write_id, tables, result_id, commit.batch)
            if done is not None:
                self._drop_stages(conn, stage_prefix(write_id))
                return done
            given, enqueued = _move(conn, tables, commit.unique, now)
            self._record_result(conn, commit.result(given, enqueued, PATH_ONE_TRANSACTION))
            self._drop_stages(conn, stage_prefix(write_id))
            result = _result(conn, result_id)
        assert result is not None
        return result

    def _commit_in_pieces(
        self, commit: WriteCommit, tables: Sequence[str], pieces: int
    ) -> WriteResult:
        """bulk_write_commit, its move done by ``pieces`` connections at once (see pieces.py)."""
        write_id, result_id, now = commit.write_id, commit.result_id, commit.now
        token = write_token(write_id)
        with self._db.connection() as lead, parallel.committing(lead, token):
            schema = str(_one(lead, _Q["spark_current_schema"]))
            move = parallel.ParallelMove(
                self._db.connect, schema, token, _stage_union(tables), pieces, now
            )
            given = _drop_held_keys(lead, tables) if commit.unique == "forever" else None
            with lead.transaction():
                done = _close_write(lead, write_id, tables, result_id, commit.batch)
                if done is None:
                    enqueued, moved = move.prepare()
                    try:
                        lead.execute(_Q["spark_commit_decide"], {"token": token, "now": now})
                        counted = moved if given is None else given
                        self._record_result(lead, commit.result(counted, enqueued, PATH_PIECES))
                    except BaseException:
                        move.roll_back()
                        raise
            if done is not None:  # committed by an earlier run: nothing was prepared
                with lead.transaction():
                    self._drop_stages(lead, stage_prefix(write_id))
                return done
            try:
                move.commit(lead)
            except psycopg.OperationalError:
                pass  # the connection was lost: see below
            else:
                with lead.transaction():
                    self._drop_stages(lead, stage_prefix(write_id))
                    lead.execute(_Q["spark_commit_forget"], {"token": token})
                    return _committed(lead, result_id)
        # The connection was lost after the decision: the write is committed, and the
        # committer's locks went with the connection, so a settle on another one
        # finishes the pieces and drops the staging.
        self._settle()
        with self._db.connection() as conn:
            return _committed(conn, result_id)

    def bulk_insert(
        self, step: BatchStep, rows: Any, unique: Unique, now: datetime
    ) -> InsertCounts:
        table = quote_ident(_DIRECT)
        key = {"write_id": step.write_id, "part": step.part}
        with self._db.transaction() as conn:
            check_open(conn, _Q["spark_write_is_open"], step.write_id)
            conn.execute(_Q["spark_progress_claim"], key)
            row = conn.execute(_Q["spark_progress_lock"], key).fetchone()
            step.check(Progress(0, 0) if row is None else Progress(int(row[0]), int(row[1])))
            conn.execute(_Q["spark_direct_create"].format(stage=table))
            self._stage_rows(conn, table, rows)
            given, enqueued = _move(conn, [table], unique, now)
            conn.execute(_Q["spark_progress_advance"], step.advance_params(given, enqueued))
        return InsertCounts(enqueued, given - enqueued)

    def _settle(self) -> list[str]:
        """Finish the parallel commits whose committer died (see pieces.settle); their names."""
        names: dict[str, str] = {}

        def end_write(conn: Connection, token: str) -> None:
            for write_id, shown in _open_writes(conn).items():
                if write_token(write_id) == token:
                    names[token] = shown
                    self._end_write(conn, write_id)
            self._drop_stages(conn, token_stage_prefix(token))

        with self._db.connection() as conn:
            tokens = parallel.settle(
                conn, lambda c, token: self._drop_stages(c, token_stage_prefix(token)), end_write
            )
        return [names.get(token, token) for token in tokens]

    # --- what an operator does (conveyor spark writes / cleanup) -------------------

    def bulk_write_list(self, limit: int, abandoned_before: datetime) -> list[WriteRow]:
        """As on every database, and an open write whose committer died with pieces prepared
        is shown "stalled" (a settle ends it; see pieces.py)."""
        listed = super().bulk_write_list(limit, abandoned_before)
        with self._db.connection() as conn:
            stalled = parallel.stalled(conn)
            names = {
                shown for write_id, shown in _open_writes(conn).items()
                if write_token(write_id) in stalled
            }  # fmt: skip
        return [
            replace(row, state="stalled") if row.state != "committed" and row.id in names else row
            for row in listed
        ]

    # --- reads ------------------------------------------------------------------

    def scan(self, what: ScanRange, chunk_rows: int) -> Scan:
        known = SCAN_COLUMNS.get(what.table, ())
        sql, params = scan_query(
            _Q["scan_range"], what, known=known, placeholder="%s", select=_select
        )
        return Scan(sql, params, self._copy_out(sql, params))

    def _copy_out(self, sql: str, params: list[Any]) -> Generator[Any, None, None]:
        with self._db.connection() as conn, conn.cursor().copy(sql, params) as copy:
            # COPY sends a message per row: they are handed on joined into chunks of
            # about a megabyte, so that what reads them loops per chunk, not per row.
            pending: list[Any] = []
            size = 0
            for message in copy:
                pending.append(message)
                size += len(message)
                if size >= _COPY_CHUNK_BYTES:
                    yield b"".join(pending)
                    pending, size = [], 0
            if pending:
                yield b"".join(pending)

    def event_stream_end(self, after: EventOffset, limit: int | None, floor: int) -> EventOffset:
        params = {"xid": after[0], "seq": after[1], "floor": floor, "limit": limit}
        statement = _Q["event_stream_latest" if limit is None else "event_stream_latest_limited"]
        with self._db.connection() as conn:
            row = conn.execute(statement, params).fetchone()
        return after if row is None else (int(row[0]), int(row[1]))


def _open_writes(conn: Connection) -> dict[str, str]:
    """The open writes: each one's id, and the name it is shown by (the caller's writeId)."""
    rows = conn.execute(_OPS["spark_write_open_list"]).fetchall()
    return {str(write_id): str(shown) for write_id, shown in rows}


def _close_write(
    conn: Connection, write_id: str, tables: Sequence[str], result_id: str, batch: int | None
) -> WriteResult | None:
    """End the write in this transaction; its earlier result if it was committed before.

    Deleting the write's row waits for tasks still staging under FOR SHARE; the
    tables listed after it include everything they staged. The result's row is
    locked until the transaction ends: one committer at a time per result.
    """
    closed = conn.execute(_Q["spark_write_close"], {"id": write_id}).rowcount == 1
    # A micro-batch whose tasks had no rows was never opened by them.
    if not closed and (batch is None or tables):
        raise WriteEndedError(f"write {write_id} was already committed or aborted")
    conn.execute(_Q["spark_write_result_lock"], {"id": result_id})
    done = _result(conn, result_id)
    if done is not None and (batch is None or (done.batch is not None and done.batch >= batch)):
        return replace(done, new=False)
    return None


def _drop_held_keys(conn: Connection, tables: Sequence[str]) -> int:
    """unique = 'forever': leave out staged rows whose key a job holds; return the rows given."""
    given = 0
    for table in tables:
        given += int(_one(conn, _Q["spark_stage_count"].format(stage=table)))
    for table in tables:
        conn.execute(_Q["spark_stage_drop_held_keys"].format(stage=table))
    return given


def _stage_union(tables: Sequence[str]) -> str:
    return " UNION ALL ".join(
        _Q["spark_stage_part"].format(part=index, stage=table) for index, table in enumerate(tables)
    )


def _move(
    conn: Connection, tables: Sequence[str], unique: Unique, now: datetime
) -> tuple[int, int]:
    """Move staged rows into jobs in this transaction; return (rows given, jobs inserted)."""
    if not tables:
        return 0, 0
    given = _drop_held_keys(conn, tables) if unique == "forever" else None
    params = {"now": now, "pieces": 1, "piece": 0}
    statement = _Q["spark_stage_move"].format(stages=_stage_union(tables))
    row = conn.execute(statement, params).fetchone()
    inserted, moved = (int(row[0]), int(row[1])) if row else (0, 0)
    return (moved if given is None else given), inserted


def _one(conn: Connection, sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _committed(conn: Connection, result_id: str) -> WriteResult:
    result = _result(conn, result_id)
    assert result is not None, f"write {result_id} committed without a result"
    return result


def _result(conn: Connection, result_id: str) -> WriteResult | None:
    return write_result(
        conn, _Q["spark_write_result_get"], result_id, PostgresSparkStorage._time_back
    )


def _select(column: str) -> str:
    if column in TIME_COLUMNS:
        # Microseconds since the epoch: Arrow's CSV reader parses an integer far
        # faster than a timestamptz with its zone suffix.
        return f"(extract(epoch from {column}) * 1000000)::int8"
    if column in _JSON_COLUMNS:
        return f"{column}::text"
    return column
