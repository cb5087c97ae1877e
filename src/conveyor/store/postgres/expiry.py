"""ExpiringStore on PostgreSQL: deadlines to start by (conveyor/expiry.py), in expiry.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.expiry import EXPIRE_LIMIT, EXPIRED_ERROR
from conveyor.job import NewJob
from conveyor.store.postgres import flows as pg_flows
from conveyor.store.postgres.base import PostgresBase, set_per_job
from conveyor.store.sql import load_queries

_X = load_queries("conveyor.store.postgres", "expiry.sql")


def write_deadlines(conn: Any, written: dict[int, NewJob]) -> None:
    """Give the jobs just inserted (id -> the job) their deadlines, in the insert's
    transaction; nothing is run when none has one."""
    set_per_job(conn, _X["job_set_expiry"], {i: new.expires_at for i, new in written.items()})


class PostgresExpiry(PostgresBase):
    """Mixed into PostgresStore: one statement judges and ends the expired jobs."""

    def job_expire(self, now: datetime | None = None, limit: int = EXPIRE_LIMIT) -> list[int]:
        with self._tx() as conn:
            params = {"now": now, "limit": limit, "error": EXPIRED_ERROR}
            ids = sorted(r[0] for r in conn.execute(_X["job_expire"], params))
            # The jobs waiting for them: cancelled, or run anyway (flows).
            pg_flows.release(conn, ids, now)
        return ids

    def job_expires_at(self, job_ids: Sequence[int]) -> dict[int, datetime]:
        return self._per_job(_X["job_expires_at"], job_ids)

    def job_expired_counts(self) -> dict[str, int]:
        with self._conn() as conn:
            rows = conn.execute(_X["job_expired_counts"], {"error": EXPIRED_ERROR}).fetchall()
        return {queue: int(count) for queue, count in rows}
