"""PostgresStore's PayloadStore (store/payloads.py): jobs' values read by page, rewritten."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from conveyor.store.payloads import PayloadChange, StoredPayload
from conveyor.store.sql import load_queries

if TYPE_CHECKING:
    from psycopg import Connection

_P = load_queries("conveyor.store.postgres", "payloads.sql")


class PostgresPayloads:
    """A mixin of PostgresStore."""

    if TYPE_CHECKING:

        def _conn(self, connection: Any = None) -> AbstractContextManager[Connection]: ...

        def _tx(self) -> AbstractContextManager[Connection]: ...

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
        written = 0
        with self._tx() as conn:
            for change in changes:
                params = {
                    "id": change.id,
                    "field": change.field,
                    "old": change.old,
                    "new": change.new,
                    "step": change.step,
                }
                name = "payload_rewrite_step" if change.field == "step" else "payload_rewrite_job"
                written += conn.execute(_P[name], params).rowcount
        return written


def _steps(text: str) -> Iterator[tuple[str, str]]:
    """The (name, result text) pairs of a page row's steps."""
    for name, result in json.loads(text):
        yield str(name), str(result)
