"""Per-task metrics on SQLite: the fold and reads of migration 021's tables.

A mixin of SQLiteStore (its ``_conn`` and ``_write``); the rules are in
``metrics.sql``. See ``conveyor.store.metrics_protocol``.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.store.boundary import translate_errors
from conveyor.store.metrics_protocol import (
    FOLD_LIMIT,
    Grouping,
    TaskMetricRow,
    per_time_statement,
    prune_cutoffs,
    span_start,
)
from conveyor.store.sql import load_queries

_M = load_queries("conveyor.store.sqlite", "metrics.sql")


def _is_missing(exc: BaseException) -> bool:
    # The store's own rules, read when an error happens (store.py imports this module).
    from conveyor.store.sqlite import store

    return store._missing_table(exc)


def _away(exc: BaseException) -> str | None:
    from conveyor.store.sqlite import store

    return store._away(exc)


@translate_errors(_is_missing, _away)
class SQLiteTaskMetrics:
    """TaskMetricsStore for SQLiteStore."""

    if TYPE_CHECKING:  # SQLiteStore's

        def _conn(self) -> sqlite3.Connection: ...
        def _write(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def task_metrics_fold(self, limit: int = FOLD_LIMIT) -> int:
        """Fold the next events, under the write lock (one writer: no event can
        appear below the offset later)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        with self._write() as conn:
            upto, count = conn.execute(_M["task_metrics_chunk"], {"limit": limit}).fetchone()
            if not count:
                return 0
            conn.execute(_M["task_metrics_fold"], {"upto": upto})
            conn.execute(_M["task_metrics_fold_offset"], {"upto": upto})
            return int(count)

    def task_metrics_read(
        self,
        span: int,
        since: datetime,
        per: Grouping,
        queue: str | None = None,
        task: str | None = None,
    ) -> list[TaskMetricRow]:
        params = {
            "span": span,
            "since": span_start(since, span) if span else 0,
            "queue": queue,
            "task": task,
        }
        conn = self._conn()
        if per == "task":
            rows = conn.execute(_M["task_metrics_per_task"], params).fetchall()
            return [TaskMetricRow(0, q, t, s, b, n, sec) for q, t, s, b, n, sec in rows]
        rows = conn.execute(_M[per_time_statement(params)], params).fetchall()
        return [TaskMetricRow(start, "", "", s, b, n, sec) for start, s, b, n, sec in rows]

    def task_metrics_prune(self, now: datetime) -> int:
        params = prune_cutoffs(now)
        with self._write() as conn:
            return conn.execute(_M["task_metrics_prune"], params).rowcount
