"""The Redis store's reads of single limit keys (conveyor.store.limit_keys), one
script each (scripts/limit_key_usage.lua, scripts/limit_throttled_keys.lua)."""

from __future__ import annotations

from datetime import UTC, datetime

from conveyor.store.limit_keys import KeyThrottle, KeyUsage
from conveyor.store.redis.base import RedisBase


def _moment(value: str) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


class RedisLimitKeys(RedisBase):
    """Mixed into RedisStore, whose ``_run`` runs its scripts."""

    def limit_key_usage(self, queue: str, limit_key: str, now: datetime) -> KeyUsage:
        running, started, until = self._run(
            "limit_key_usage", queue, limit_key, f"{now.timestamp():.6f}"
        )
        return KeyUsage(
            queue, limit_key, int(running), int(started), _moment(until) if until else None
        )

    def limit_throttled_keys(
        self, now: datetime, limit: int, queue: str | None = None
    ) -> list[KeyThrottle]:
        flat = self._run("limit_throttled_keys", f"{now.timestamp():.6f}", queue or "")
        found = [
            KeyThrottle(flat[i], flat[i + 1], _moment(flat[i + 2])) for i in range(0, len(flat), 3)
        ]
        found.sort(key=lambda t: (t.until, t.queue, t.limit_key))
        return found[:limit]
