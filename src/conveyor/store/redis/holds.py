"""HoldStore on Redis: single queued jobs held back and let go."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from conveyor.job import HOLD_AT
from conveyor.store.holding import HoldByName
from conveyor.store.redis.base import _nm, _ts
from conveyor.store.redis.core import CoreMixin
from conveyor.store.selection import NO_ID_BOUND


class HoldsMixin(HoldByName, CoreMixin):
    """Held jobs (``HoldStore``)."""

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        ordered = json.dumps([str(i) for i in sorted(set(job_ids))])
        changed = self._run(name, _ts(now), ordered, _ts(HOLD_AT))
        return sorted(int(i) for i in changed)

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        names = [queue] if queue is not None else self._queue_names()

        def read() -> list[int]:
            pipe = self._client.pipeline(transaction=False)
            for name in names:  # held: due at the hold moment, in the due index
                pipe.zrangebyscore(self._k("due", _nm(name)), _ts(HOLD_AT), "+inf")
            return [int(i) for ids in pipe.execute() for i in ids]

        bound = before_id if before_id is not None else NO_ID_BOUND
        return sorted((i for i in self._do(read) if i < bound), reverse=True)[:limit]
