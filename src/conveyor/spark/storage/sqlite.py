"""The Spark layer's storage on SQLite: ``SparkStorage`` on a SQLite store it holds.

It reaches the store's connections and write lock through the store's public
session (``SQLiteStore.session()``), never its private members.

Every write happens under the store's own write lock (``BEGIN IMMEDIATE``),
so what a statement reads stays true until the transaction commits. A move of
staged rows uses the statements ``job_insert_many`` uses for ids and events
(included from the store's ``queries.sql`` into ``sqlite.sql``), and the
``jobs_live_key`` index for keys: the rules of an enqueue are the store's, not
a copy.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from conveyor.spark.storage import (
    PATH_ONE_TRANSACTION,
    BatchStep,
    InsertCounts,
    Progress,
    Scan,
    ScanRange,
    Unique,
    WriteCommit,
    WriteEndedError,
    WriteResult,
    quote_ident,
    scan_query,
    stage_prefix,
)
from conveyor.spark.storage.common import SQLSparkStorage, check_open, stage_table
from conveyor.spark.storage.scan import SCAN_COLUMNS
from conveyor.store.records import EventOffset
from conveyor.store.sql import load_migrations, load_queries
from conveyor.store.sqlite.session import SQLiteSession
from conveyor.store.sqlite.store import SQLiteStore

_Q = load_queries("conveyor.spark.storage", "sqlite.sql")
#: What an operator does with Spark's writes: list, clean up, purge.
_OPS = load_queries("conveyor.spark.storage", "operations.sql")
_MIGRATIONS = load_migrations("conveyor.spark.storage", "migrations/sqlite")
#: The temporary table a non-atomic write stages each batch in (one per connection).
_DIRECT = "spark_direct"


def _ts(value: datetime) -> float:
    return value.timestamp()


class SQLiteSparkStorage(SQLSparkStorage):
    """Spark's storage on a SQLite store it holds, through the store's public session."""

    stage_format: Literal["rows", "csv"] = "rows"
    _Q = _Q
    _OPS = _OPS
    _MIGRATIONS = _MIGRATIONS
    _OPEN_ALREADY = sqlite3.IntegrityError

    def __init__(self, path: str | Path, *, migrate: bool = False) -> None:
        self.store = SQLiteStore(path, migrate=migrate)
        self._db: SQLiteSession = self.store.session()
        self.description = self.store.description

    def _reading(self) -> AbstractContextManager[sqlite3.Connection]:
        return nullcontext(self._db.connection())

    def _changing(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._db.write()

    @staticmethod
    def _time(value: datetime) -> float:
        return _ts(value)

    @staticmethod
    def _time_back(value: Any) -> datetime:
        return datetime.fromtimestamp(value, UTC)

    def _stream_range(self, after: EventOffset, until: EventOffset, floor: int) -> dict[str, Any]:
        # One sequence: the transaction id of an offset is always 0 here.
        return {"after": max(after[1], floor - 1), "until": until[1]}

    # --- writes -----------------------------------------------------------------

    def _stage_rows(self, conn: sqlite3.Connection, table: str, rows: Any) -> None:
        conn.executemany(_Q["spark_stage_insert"].format(stage=table), rows)

    def bulk_write_commit(self, commit: WriteCommit) -> WriteResult:
        # pieces: SQLite has one writer, so a move in parallel pieces gains nothing.
        write_id, result_id, batch = commit.write_id, commit.result_id, commit.batch
        tables = [stage_table(write_id, s) for s in commit.stages]
        with self._db.write() as conn:
            closed = conn.execute(_Q["spark_write_close"], {"id": write_id}).rowcount == 1
            # A micro-batch whose tasks had no rows was never opened by them.
            if not closed and (batch is None or tables):
                raise WriteEndedError(f"write {write_id} was already committed or aborted")
            done = self._result(conn, result_id)
            if done is not None and (
                batch is None or (done.batch is not None and done.batch >= batch)
            ):
                self._drop_stages(conn, stage_prefix(write_id))
                return replace(done, new=False)
            given, enqueued = _move(conn, tables, commit.unique, _ts(commit.now))
            self._record_result(conn, commit.result(given, enqueued, PATH_ONE_TRANSACTION))
            self._drop_stages(conn, stage_prefix(write_id))
            result = self._result(conn, result_id)
        assert result is not None
        return result

    def bulk_insert(
        self, step: BatchStep, rows: Any, unique: Unique, now: datetime
    ) -> InsertCounts:
        table = quote_ident(_DIRECT)
        with self._db.write() as conn:
            check_open(conn, _Q["spark_write_is_open"], step.write_id)
            step.check(_progress(conn, step.write_id, step.part))
            conn.execute(_Q["spark_direct_create"].format(stage=table))
            self._stage_rows(conn, table, rows)
            given, enqueued = _move(conn, [table], unique, _ts(now))
            conn.execute(_Q["spark_direct_clear"].format(stage=table))
            conn.execute(_Q["spark_progress_advance"], step.advance_params(given, enqueued))
        return InsertCounts(enqueued, given - enqueued)

    # --- reads ------------------------------------------------------------------

    def scan(self, what: ScanRange, chunk_rows: int) -> Scan:
        known = SCAN_COLUMNS.get(what.table, ())
        sql, params = scan_query(
            _Q["scan_range"], what, known=known, placeholder="?", epoch_times=True
        )
        return Scan(sql, params, self._chunks(sql, params, chunk_rows))

    def _chunks(self, sql: str, params: list[Any], size: int) -> Generator[list[Any], None, None]:
        cursor = self._db.connection().execute(sql, params)
        try:
            while rows := cursor.fetchmany(size):
                yield rows
        finally:
            cursor.close()

    def event_stream_end(self, after: EventOffset, limit: int | None, floor: int) -> EventOffset:
        start = max(after[1], floor - 1)
        conn = self._db.connection()
        if limit is None:
            seq = conn.execute(_Q["event_stream_latest"]).fetchone()[0]
        else:
            bounds = {"after": start, "limit": limit}
            seq = conn.execute(_Q["event_stream_latest_limited"], bounds).fetchone()[0]
        return (0, max(seq or 0, after[1]))


def _move(
    conn: sqlite3.Connection, tables: Sequence[str], unique: Unique, now_ts: float
) -> tuple[int, int]:
    """Move staged rows into jobs; return (rows given, jobs inserted)."""
    counts = [conn.execute(_Q["spark_stage_count"].format(stage=t)).fetchone()[0] for t in tables]
    given = sum(counts)
    if not given:
        return 0, 0
    if unique == "forever":
        for table in tables:
            conn.execute(_Q["spark_stage_drop_held_keys"].format(stage=table))
    # Ids from the store's counter, reserved under this write lock in staging
    # order; rowids run 1..n per table (the keys left out above leave gaps, and
    # their ids go unused).
    last = conn.execute(_Q["spark_take_ids"], {"count": given}).fetchone()[0]
    first = last - given + 1
    offset = first
    inserted = 0
    for table, count in zip(tables, counts, strict=True):
        params = {"first": offset, "now": now_ts}
        inserted += conn.execute(_Q["spark_stage_move"].format(stage=table), params).rowcount
        offset += count
    conn.execute(_Q["spark_insert_enqueued_events"], {"first": first, "last": last})
    return given, inserted


def _progress(conn: sqlite3.Connection, write_id: str, part: int) -> Progress:
    row = conn.execute(_Q["spark_progress_get"], {"write_id": write_id, "part": part}).fetchone()
    return Progress(0, 0) if row is None else Progress(row[0], row[1])
