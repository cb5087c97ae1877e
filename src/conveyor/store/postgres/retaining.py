"""RetainingStore on PostgreSQL: each job's own retention (conveyor/retain.py), in retaining.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import NewJob
from conveyor.retain import RETAIN_PURGE_LIMIT
from conveyor.store.postgres.base import _Q, PostgresBase, set_per_job
from conveyor.store.sql import load_queries

_T = load_queries("conveyor.store.postgres", "retaining.sql")


def write_retain(conn: Any, written: dict[int, NewJob]) -> None:
    """Give the jobs just inserted (id -> the job) their own retention, in the insert's
    transaction; nothing is run when none has one."""
    set_per_job(conn, _T["job_set_retain"], {i: new.retain for i, new in written.items()})


class PostgresRetaining(PostgresBase):
    """Mixed into PostgresStore: one statement judges and deletes the jobs past their rule."""

    def job_purge_retained(self, now: datetime, limit: int = RETAIN_PURGE_LIMIT) -> int:
        with self._tx() as conn:
            conn.execute(_Q["finished_counts_lock"])  # first, as every delete takes it
            row = conn.execute(_T["job_purge_retained"], {"now": now, "limit": limit}).fetchone()
        return int(row[0]) if row else 0

    def job_retain(self, job_ids: Sequence[int]) -> dict[int, str]:
        return self._per_job(_T["job_retain"], job_ids)
