"""HoldStore on SQLite: single queued jobs held back and let go."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from conveyor.job import HOLD_AT
from conveyor.store.holding import HoldByName
from conveyor.store.selection import NO_ID_BOUND
from conveyor.store.sqlite.base import _S, _ts
from conveyor.store.sqlite.core import CoreMixin


class HoldsMixin(HoldByName, CoreMixin):
    """Held jobs (``HoldStore``)."""

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        now_ts = _ts(now)
        params = {"ids": json.dumps(list(job_ids)), "now": now_ts, "hold_at": _ts(HOLD_AT)}
        with self._write() as conn:
            ids = sorted(r[0] for r in conn.execute(_S[name], params))
            self._record(conn, name.removeprefix("job_"), ids, now_ts)
        return ids

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        params = {
            "queue": queue, "hold_at": _ts(HOLD_AT), "limit": limit,
            "before_id": before_id if before_id is not None else NO_ID_BOUND,
        }  # fmt: skip
        return [r[0] for r in self._conn().execute(_S["job_held"], params)]
