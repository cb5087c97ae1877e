"""The PostgreSQL store's retry of a workflow from its failures: one statement
(workflow_retry.sql; the rule is conveyor.store.workflow_retry's)."""

from __future__ import annotations

from datetime import datetime

from psycopg import errors as pg_errors

from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries
from conveyor.store.workflow_retry import key_taken

_R = load_queries("conveyor.store.postgres", "workflow_retry.sql")


class PostgresWorkflowRetry(PostgresBase):
    """Mixed into PostgresStore, whose pooled ``_conn`` it runs on."""

    def workflow_retry(self, workflow_id: str, now: datetime) -> list[int]:
        params = {"workflow": workflow_id, "now": now}
        try:
            with self._conn() as conn:
                rows = conn.execute(_R["workflow_retry"], params).fetchall()
        except pg_errors.UniqueViolation as exc:
            raise key_taken(workflow_id) from exc
        return sorted(int(row[0]) for row in rows)
