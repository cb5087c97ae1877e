"""What an operator asks of a worker (conveyor.store.worker_control): merged into the
worker's row by ``worker_control.sql``."""

from __future__ import annotations

from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries
from conveyor.store.sql_shared import control_worker

_W = load_queries("conveyor.store.postgres", "worker_control.sql")


class PostgresWorkerControl(PostgresBase):
    """WorkerControlStore for the postgres store."""

    def worker_control(self, worker_id: str, changes: str) -> str | None:
        with self._conn() as conn:
            return control_worker(conn, _W, worker_id, changes)
