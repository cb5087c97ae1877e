"""OutcomeStore on PostgreSQL: finished jobs whose outcome is not processed yet."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from conveyor.store.postgres.base import _S
from conveyor.store.postgres.core import CoreMixin


class OutcomesMixin(CoreMixin):
    """Outcome readers' listing and compare-and-set mark (``OutcomeStore``)."""

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        params = {"queue": queue, "states": list(states), "since": since, "limit": limit}
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_S["job_unprocessed"], params)]

    def job_mark_processed(self, job_id: int) -> bool:
        with self._conn() as conn:
            return conn.execute(_S["job_mark_processed"], {"id": job_id}).rowcount == 1
