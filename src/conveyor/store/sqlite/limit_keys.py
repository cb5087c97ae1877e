"""The SQLite store's reads of single limit keys (conveyor.store.limit_keys)."""

from __future__ import annotations

from datetime import UTC, datetime

from conveyor.store.limit_keys import KeyThrottle, KeyUsage
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import SQLiteBase

_L = load_queries("conveyor.store.sqlite", "limit_keys.sql")


def _moment(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


class SQLiteLimitKeys(SQLiteBase):
    """Mixed into SQLiteStore, whose ``_conn`` it reads on."""

    def limit_key_usage(self, queue: str, limit_key: str, now: datetime) -> KeyUsage:
        params = {"queue": queue, "key": limit_key, "now": now.timestamp()}
        conn = self._conn()
        conn.execute("BEGIN")  # one read transaction: the three figures of one moment
        try:
            running, started, until = conn.execute(_L["limit_key_usage"], params).fetchone()
        finally:
            conn.execute("COMMIT")
        return KeyUsage(
            queue, limit_key, int(running), int(started), None if until is None else _moment(until)
        )

    def limit_throttled_keys(
        self, now: datetime, limit: int, queue: str | None = None
    ) -> list[KeyThrottle]:
        params = {"now": now.timestamp(), "limit": limit, "queue": queue}
        rows = self._conn().execute(_L["limit_throttled_keys"], params)
        return [KeyThrottle(queue, key, _moment(until)) for queue, key, until in rows]
