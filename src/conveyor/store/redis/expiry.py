"""ExpiringStore on Redis: deadlines to start by (conveyor/expiry.py).

A job's deadline is the field ``expires_at`` of its hash, written by the insert
script only for a job that has one; the zset ``expiring`` holds the queued jobs
that have one by deadline (common.lua's enter and leave), for the sweep
(``job_expire.lua``). The claim's walk passes by a job past its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.expiry import EXPIRE_LIMIT, EXPIRED_ERROR
from conveyor.store.redis.base import _nm, _now_arg, _odt
from conveyor.store.redis.core import CoreMixin


class RedisExpiry(CoreMixin):
    """Mixed into RedisStore: one script judges and ends the expired jobs."""

    def job_expire(self, now: datetime | None = None, limit: int = EXPIRE_LIMIT) -> list[int]:
        ended = self._run("job_expire", _now_arg(now), str(limit), EXPIRED_ERROR)
        return sorted(int(i) for i in ended)

    def job_expires_at(self, job_ids: Sequence[int]) -> dict[int, datetime]:
        if not job_ids:
            return {}
        values = zip(job_ids, self._job_field(job_ids, "expires_at"), strict=True)
        return {job_id: at for job_id, value in values if (at := _odt(value)) is not None}

    def job_expired_counts(self) -> dict[str, int]:
        names = self._queue_names()

        def read() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.zcard(self._k("expired", _nm(name)))
            return [int(n) for n in pipe.execute()]

        return {name: n for name, n in zip(names, self._do(read), strict=True) if n}
