"""OutcomeStore on SQLite: finished jobs whose outcome is not processed yet."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from conveyor.store.sqlite.base import _S, _ts
from conveyor.store.sqlite.core import CoreMixin


class OutcomesMixin(CoreMixin):
    """Outcome readers' listing and compare-and-set mark (``OutcomeStore``)."""

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        params = {
            "queue": queue, "states": json.dumps(list(states)), "since": _ts(since),
            "limit": limit,
        }  # fmt: skip
        return [r[0] for r in self._conn().execute(_S["job_unprocessed"], params)]

    def job_mark_processed(self, job_id: int) -> bool:
        with self._write() as conn:
            return conn.execute(_S["job_mark_processed"], {"id": job_id}).rowcount == 1
