"""The PostgreSQL store's reads of single limit keys (conveyor.store.limit_keys)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from conveyor.store.limit_keys import KeyThrottle, KeyUsage
from conveyor.store.postgres.base import PostgresBase
from conveyor.store.sql import load_queries

_L = load_queries("conveyor.store.postgres", "limit_keys.sql")


class PostgresLimitKeys(PostgresBase):
    """Mixed into PostgresStore, whose pooled ``_conn`` it reads on."""

    def limit_key_usage(self, queue: str, limit_key: str, now: datetime) -> KeyUsage:
        params = {"queue": queue, "key": limit_key, "now": now}
        with self._conn() as conn:  # one statement: the three figures of one snapshot
            row = conn.execute(_L["limit_key_usage"], params).fetchone()
        assert row is not None  # an aggregate: always one row
        running, started, until = row
        return KeyUsage(queue, limit_key, int(running), int(started), until)

    def limit_throttled_keys(
        self, now: datetime, limit: int, queue: str | None = None
    ) -> list[KeyThrottle]:
        params = {"now": now, "limit": limit, "queue": queue}
        with self._conn() as conn:
            rows: Iterator[Any] = conn.execute(_L["limit_throttled_keys"], params)
            return [KeyThrottle(queue, key, until) for queue, key, until in rows]
