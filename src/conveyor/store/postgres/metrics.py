"""Per-task metrics on PostgreSQL: the fold and reads of migration 021's tables.

A mixin of PostgresStore (its ``_tx`` and ``_conn``); the rules are in
``metrics.sql``. See ``conveyor.store.metrics_protocol``.
"""

from __future__ import annotations

from datetime import datetime

from psycopg import errors as pg_errors

from conveyor.store.metrics_protocol import (
    FOLD_LIMIT,
    MetricsQuery,
    TaskMetricRow,
    prune_cutoffs,
)
from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries

_M = load_queries("conveyor.store.postgres", "metrics.sql")


class PostgresTaskMetrics(PostgresBase):
    """TaskMetricsStore for PostgresStore."""

    def task_metrics_fold(self, limit: int = FOLD_LIMIT) -> int:
        """Fold the next events; skipped while another fold holds the offset, and on
        a read-only server (a hot standby reads what the primary folded)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        try:
            with self._tx() as conn:
                offset = conn.execute(_M["task_metrics_lock_fold"]).fetchone()
                if offset is None:
                    return 0
                conn.execute(_M["task_metrics_plan_for_values"])  # the events after it
                params = {"xid": offset[0], "seq": offset[1], "limit": limit}
                row = conn.execute(_M["task_metrics_fold"], params).fetchone()
                return int(row[0]) if row else 0
        except pg_errors.ReadOnlySqlTransaction:
            return 0

    def task_metrics_read(self, query: MetricsQuery) -> list[TaskMetricRow]:
        with self._tx() as conn:
            conn.execute(_M["task_metrics_plan_for_values"])
            return query.rows(conn.execute(_M[query.statement()], query.params()))

    def task_metrics_prune(self, now: datetime) -> int:
        params = prune_cutoffs(now)
        try:
            with self._tx() as conn:
                conn.execute(_M["task_metrics_plan_for_values"])
                return conn.execute(_M["task_metrics_prune"], params).rowcount
        except pg_errors.ReadOnlySqlTransaction:
            return 0  # a hot standby: the primary prunes
