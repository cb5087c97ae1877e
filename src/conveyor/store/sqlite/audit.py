"""The SQLite store's audit (conveyor.store.audit): the ``audit_log`` table."""

from __future__ import annotations

from datetime import UTC, datetime

from conveyor.store.audit import AuditAction, AuditEntry
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import SQLiteBase

_A = load_queries("conveyor.store.sqlite", "audit.sql")


class SQLiteAudit(SQLiteBase):
    """AuditStore for SQLiteStore (one of its base classes: uses its ``_write`` and ``_conn``)."""

    def audit_record(self, action: AuditAction, at: datetime) -> None:
        params = {"at": at.timestamp(), **action.kept()}
        with self._write() as conn:
            conn.execute(_A["audit_insert"], params)

    def audit_list(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        rows = self._conn().execute(_A["audit_list"], {"limit": limit, "before": before})
        return [
            AuditEntry(i, datetime.fromtimestamp(at, UTC), actor, source, action, target, jobs)
            for i, at, actor, source, action, target, jobs in rows.fetchall()
        ]
