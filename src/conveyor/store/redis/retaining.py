"""RetainingStore on Redis: each job's own retention (conveyor/retain.py).

A job's rule is the field ``retain`` of its hash, written by the insert script
only for a job that has one; the zset ``retaining`` holds the finished jobs
whose rule names the state they ended in, by the moment each is due to go
(common.lua's enter and leave), for the round (``job_purge_retained.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.retain import RETAIN_PURGE_LIMIT
from conveyor.store.redis.base import _ts
from conveyor.store.redis.core import CoreMixin


class RedisRetaining(CoreMixin):
    """Mixed into RedisStore: one script judges and deletes the jobs past their rule."""

    def job_purge_retained(self, now: datetime, limit: int = RETAIN_PURGE_LIMIT) -> int:
        return len(self._run("job_purge_retained", _ts(now), str(limit)))

    def job_retain(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        values = zip(job_ids, self._job_field(job_ids, "retain"), strict=True)
        return {job_id: rule for job_id, rule in values if rule}
