"""Per-task metrics on SQLite: the fold and reads of migration 021's tables.

A mixin of SQLiteStore (its ``_conn`` and ``_write``); the rules are in
``metrics.sql``. See ``conveyor.store.metrics_protocol``.
"""

from __future__ import annotations

from datetime import datetime

from conveyor.store.metrics_protocol import (
    FOLD_LIMIT,
    MetricsQuery,
    TaskMetricRow,
    prune_cutoffs,
)
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import SQLiteBase

_M = load_queries("conveyor.store.sqlite", "metrics.sql")


class SQLiteTaskMetrics(SQLiteBase):
    """TaskMetricsStore for SQLiteStore."""

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

    def task_metrics_read(self, query: MetricsQuery) -> list[TaskMetricRow]:
        return query.rows(self._conn().execute(_M[query.statement()], query.params()))

    def task_metrics_prune(self, now: datetime) -> int:
        params = prune_cutoffs(now)
        with self._write() as conn:
            return conn.execute(_M["task_metrics_prune"], params).rowcount
