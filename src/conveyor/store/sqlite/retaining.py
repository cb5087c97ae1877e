"""RetainingStore on SQLite: each job's own retention (conveyor/retain.py), in retaining.sql."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from conveyor.retain import RETAIN_PURGE_LIMIT
from conveyor.store.sql import load_queries
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import SQLiteBase, _ts

_T = load_queries("conveyor.store.sqlite", "retaining.sql")


def write_retain(conn: sqlite3.Connection, rules: list[tuple[int, str | None]]) -> None:
    """Give the jobs just inserted (id, rule) their own retention, in the insert's
    transaction; nothing is run when none has one."""
    pairs = [[i, rule] for i, rule in rules if rule is not None]
    if pairs:
        conn.execute(_T["job_set_retain"], {"rules": json.dumps(pairs)})


class SQLiteRetaining(SQLiteBase):
    """Mixed into SQLiteStore: its one writer judges and deletes the jobs past their rule."""

    def job_purge_retained(self, now: datetime, limit: int = RETAIN_PURGE_LIMIT) -> int:
        params = {"now": _ts(now), "limit": limit}
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(_T["job_purge_retained_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return len(ids)

    def job_retain(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        rows = self._conn().execute(_T["job_retain"], {"ids": json.dumps(list(job_ids))})
        return {int(job_id): rule for job_id, rule in rows}
