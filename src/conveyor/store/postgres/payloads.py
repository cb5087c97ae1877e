"""PostgresStore's PayloadStore (store/payloads.py): jobs' values read by page, rewritten."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from conveyor.store.payloads import PayloadChange, StoredPayload
from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries

if TYPE_CHECKING:
    pass

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
