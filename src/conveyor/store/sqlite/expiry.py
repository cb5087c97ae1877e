"""ExpiringStore on SQLite: deadlines to start by (conveyor/expiry.py), in expiry.sql."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.expiry import EXPIRE_LIMIT, EXPIRED_ERROR
from conveyor.job import NewJob, utcnow
from conveyor.store.sql import load_queries
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import SQLiteBase, _dt_required, _ts

_X = load_queries("conveyor.store.sqlite", "expiry.sql")


def insert_with_deadlines(
    conn: sqlite3.Connection, rows: list[tuple[Any, ...]], new_jobs: list[NewJob]
) -> None:
    """The insert of job_insert_many (``rows`` as job_insert takes them) for a batch
    in which some job has a deadline: the same insert with the deadline column."""
    conn.executemany(
        _X["job_insert_expiring"],
        [
            (*row, None if new.expires_at is None else _ts(new.expires_at))
            for row, new in zip(rows, new_jobs, strict=True)
        ],
    )


class SQLiteExpiry(SQLiteBase):
    """Mixed into SQLiteStore: its one writer decides each expiry under the write lock."""

    def job_expire(self, now: datetime | None = None, limit: int = EXPIRE_LIMIT) -> list[int]:
        now_ts = _ts(now or utcnow())
        with self._write() as conn:
            params = {"now": now_ts, "limit": limit, "error": EXPIRED_ERROR}
            ids = sorted(r[0] for r in conn.execute(_X["job_expire"], params))
            if ids:
                conn.execute(_X["event_insert_expired"], {"ids": json.dumps(ids), "now": now_ts})
                # The jobs waiting for them: cancelled, or run anyway (flows).
                sqlite_flows.release(conn, ids, now_ts)
        return ids

    def job_expires_at(self, job_ids: Sequence[int]) -> dict[int, datetime]:
        if not job_ids:
            return {}
        rows = self._conn().execute(_X["job_expires_at"], {"ids": json.dumps(list(job_ids))})
        return {job_id: _dt_required(at) for job_id, at in rows}

    def job_expired_counts(self) -> dict[str, int]:
        rows = self._conn().execute(_X["job_expired_counts"], {"error": EXPIRED_ERROR})
        return {queue: int(count) for queue, count in rows}
