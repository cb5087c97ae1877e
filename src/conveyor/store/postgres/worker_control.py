"""What an operator asks of a worker (conveyor.store.worker_control): merged into the
worker's row by ``worker_control.sql``."""

from __future__ import annotations

from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries

_W = load_queries("conveyor.store.postgres", "worker_control.sql")


class PostgresWorkerControl(PostgresBase):
    """WorkerControlStore for the postgres store."""

    def worker_control(self, worker_id: str, changes: str) -> str | None:
        with self._conn() as conn:
            row = conn.execute(_W["worker_control"], {"id": worker_id, "changes": changes})
            found = row.fetchone()
        return None if found is None else str(found[0])
