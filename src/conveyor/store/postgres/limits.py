"""FlowControlStore on PostgreSQL: rate and concurrency limits and throttles."""

from __future__ import annotations

from datetime import datetime

from conveyor.limits import QueueLimits
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_set_params, limits_of_row
from conveyor.store.postgres.base import _Q, _same
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.records import LimitChange, LimitStatus


class LimitsMixin(CoreMixin):
    """Limits and throttles set, read and pruned (``FlowControlStore``)."""

    def _limits_changed(self, queue: str) -> None:
        """This store set a limit or throttle on ``queue``: its next claim obeys it."""
        for names in list(self._limited):
            if queue in names:
                self._saw_limits(names, True)

    def limit_set(self, change: LimitChange, now: datetime) -> QueueLimits | None:
        params = limit_set_params(change, now)
        with self._tx() as conn:
            conn.execute(_Q["limit_set"], params)
            conn.execute(_Q["limit_forget_empty"], params)
            row = conn.execute(_Q["limit_get"], params).fetchone()
        self._limits_changed(change.queue)
        return None if row is None else limits_of_row(row, _same)

    def limit_get(self, queue: str) -> QueueLimits | None:
        with self._conn() as conn:
            row = conn.execute(_Q["limit_get"], {"queue": queue}).fetchone()
        return None if row is None else limits_of_row(row, _same)

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        params = {"queue": queue, "key": limit_key, "seconds": seconds, "now": now}
        if seconds <= 0:
            name = "limit_lift_queue" if limit_key is None else "limit_lift_key"
            with self._tx() as conn:
                row = conn.execute(_Q[name], params).fetchone()
                conn.execute(_Q["limit_forget_empty"], params)
        else:
            name = "limit_throttle_queue" if limit_key is None else "limit_throttle_key"
            with self._conn() as conn:
                row = conn.execute(_Q[name], params).fetchone()
            self._limits_changed(queue)
        assert row is not None
        until: datetime = row[0]
        return until

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        with self._tx() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return self._limit_usage(conn, now)

    def limit_prune(self, now: datetime) -> None:
        params = {"now": now, "slack": LIMIT_SLACK_SECONDS}
        with self._tx() as conn:
            conn.execute(_Q["limit_prune_all_starts"], params)
            conn.execute(_Q["limit_prune_throttles"], params)
            conn.execute(_Q["limit_prune_rows"], params)
