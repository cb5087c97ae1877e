"""SQLiteStore's PayloadStore (store/payloads.py): jobs' values read by page, rewritten."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.store.payloads import PayloadChange, StoredPayload
from conveyor.store.sql import load_queries
from conveyor.store.sql_shared import rewrite_payloads
from conveyor.store.sqlite.base import SQLiteBase

_P = load_queries("conveyor.store.sqlite", "payloads.sql")


class SQLitePayloads(SQLiteBase):
    """A mixin of SQLiteStore."""

    def payload_page(self, after_id: int, limit: int) -> tuple[list[StoredPayload], int | None]:
        conn = self._conn()
        rows = conn.execute(_P["payload_page"], {"after_id": after_id, "limit": limit})
        jobs = rows.fetchall()
        if not jobs:
            return [], None
        last = int(jobs[-1][0])
        # A step recorded between the two reads is read or not: either is right,
        # since each rewrite checks the value it replaces.
        steps: dict[int, list[tuple[str, str]]] = {}
        bounds = {"after_id": after_id, "last_id": last}
        for job_id, name, result in conn.execute(_P["payload_page_steps"], bounds):
            steps.setdefault(int(job_id), []).append((name, result))
        page = [
            StoredPayload(int(i), args, kwargs, result, tuple(steps.get(int(i), ())))
            for i, args, kwargs, result in jobs
        ]
        return page, (last if len(jobs) == limit else None)

    def payload_rewrite(self, changes: Sequence[PayloadChange]) -> int:
        with self._write() as conn:
            return rewrite_payloads(conn, _P, changes)
