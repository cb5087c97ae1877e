"""FlowControlStore on Redis: rate and concurrency limits and throttles."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.limits import QueueLimits
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_status, limits_of_row
from conveyor.store.records import LimitChange, LimitStatus
from conveyor.store.redis.base import _dt, _nm, _now_arg, _odt, _pairs, _ts
from conveyor.store.redis.core import CoreMixin


class LimitsMixin(CoreMixin):
    """Limits and throttles set, read and pruned (``FlowControlStore``)."""

    def _limits_of(self, queue: str, row: dict[str, str]) -> QueueLimits:
        names = ("rate", "per", "concurrency", "key_rate", "key_per", "key_concurrency")
        values: list[Any] = [queue]
        for name in names:
            raw = row.get(name)
            values.append(None if raw is None else float(raw) if "per" in name else int(raw))
        values.append(row.get("throttled_until"))
        return limits_of_row(values, _odt)

    def limit_set(self, change: LimitChange, now: datetime) -> QueueLimits | None:
        limit, queue = change.limit, change.queue
        rate = limit.rate if limit is not None else None
        concurrency = limit.concurrency if limit is not None else None
        row = self._run(
            "limit_set",
            queue,
            "key" if change.per_key else "queue",
            "" if rate is None else str(rate.count),
            "" if rate is None else repr(float(rate.per)),
            "" if concurrency is None else str(concurrency),
            _ts(now),
            ",".join(sorted(change.keep)),
        )
        return None if row is None else self._limits_of(queue, _pairs(row))

    def limit_get(self, queue: str) -> QueueLimits | None:
        def read() -> tuple[bool, dict[str, str]]:
            pipe = self._client.pipeline(transaction=True)
            pipe.sismember(self._k("limited"), queue)
            pipe.hgetall(self._k("limit", _nm(queue)))
            limited, row = pipe.execute()
            return bool(limited), row

        limited, row = self._do(read)
        return self._limits_of(queue, row) if limited else None

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        until = self._run("limit_throttle", queue, limit_key or "", repr(float(seconds)),
                          _now_arg(now))  # fmt: skip
        return _dt(until)

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        queues = sorted(self._do(lambda: self._client.smembers(self._k("limited"))))
        return [self._limit_usage(q, now) for q in queues]

    def _limit_usage(self, queue: str, now: datetime) -> LimitStatus:
        limits = self.limit_get(queue)
        if limits is None:
            limits = QueueLimits(queue=queue, limit=None, key_limit=None, throttled_until=None)
        usage = [int(n) for n in self._run("limit_usage", queue, _ts(now))]
        return limit_status(limits, now, *usage)

    def limit_prune(self, now: datetime) -> None:
        self._run("limit_prune", _ts(now), str(LIMIT_SLACK_SECONDS))
