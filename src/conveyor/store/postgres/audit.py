"""The PostgreSQL store's audit (conveyor.store.audit): the ``audit_log`` table."""

from __future__ import annotations

from datetime import datetime

from conveyor.store.audit import AuditAction, AuditEntry
from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries

_A = load_queries("conveyor.store.postgres", "audit.sql")


class PostgresAudit(PostgresBase):
    """AuditStore for PostgresStore (one of its base classes: uses its pooled ``_conn``)."""

    def audit_record(self, action: AuditAction, at: datetime) -> None:
        params = {"at": at, **action.kept()}
        with self._conn() as conn:
            conn.execute(_A["audit_insert"], params)

    def audit_list(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        with self._conn() as conn:
            rows = conn.execute(_A["audit_list"], {"limit": limit, "before": before}).fetchall()
        return [AuditEntry(*row) for row in rows]
