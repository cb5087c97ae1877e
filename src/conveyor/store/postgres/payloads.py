"""PostgresStore's PayloadStore (store/payloads.py): jobs' values read by page, rewritten."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from conveyor.store.payloads import PayloadChange, StoredPayload
from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries
from conveyor.store.sql_shared import rewrite_payloads

_P = load_queries("conveyor.store.postgres", "payloads.sql")


class PostgresPayloads(PostgresBase):
    """A mixin of PostgresStore."""

    def payload_page(self, after_id: int, limit: int) -> tuple[list[StoredPayload], int | None]:
        with self._conn() as conn:
            rows = conn.execute(_P["payload_page"], {"after_id": after_id, "limit": limit})
            found = rows.fetchall()
        page = [
            StoredPayload(int(i), args, kwargs, result, tuple(_steps(steps)))
            for i, args, kwargs, result, steps in found
        ]
        if not page:
            return [], None
        return page, (page[-1].id if len(page) == limit else None)

    def payload_rewrite(self, changes: Sequence[PayloadChange]) -> int:
        with self._tx() as conn:
            return rewrite_payloads(conn, _P, changes)


def _steps(text: str) -> Iterator[tuple[str, str]]:
    """The (name, result text) pairs of a page row's steps."""
    for name, result in json.loads(text):
        yield str(name), str(result)
