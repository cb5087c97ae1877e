"""HoldStore on PostgreSQL: single queued jobs held back and let go."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.job import HOLD_AT
from conveyor.store.holding import HoldByName
from conveyor.store.postgres.base import _S
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.selection import NO_ID_BOUND


class HoldsMixin(HoldByName, CoreMixin):
    """Held jobs (``HoldStore``)."""

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        params = {"ids": list(job_ids), "now": now, "hold_at": HOLD_AT}
        with self._conn() as conn:
            return sorted(r[0] for r in conn.execute(_S[name], params).fetchall())

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        params = {
            "queue": queue, "hold_at": HOLD_AT, "limit": limit,
            "before_id": before_id if before_id is not None else NO_ID_BOUND,
        }  # fmt: skip
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_S["job_held"], params)]
