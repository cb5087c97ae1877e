"""What an operator asks of a worker (conveyor.store.worker_control): merged into the
worker's row by ``worker_control.sql``."""

from __future__ import annotations

from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import SQLiteBase

_W = load_queries("conveyor.store.sqlite", "worker_control.sql")


class SQLiteWorkerControl(SQLiteBase):
    """WorkerControlStore for the sqlite store."""

    def worker_control(self, worker_id: str, changes: str) -> str | None:
        with self._write() as conn:
            row = conn.execute(_W["worker_control"], {"id": worker_id, "changes": changes})
            found = row.fetchone()
        return None if found is None else str(found[0])
