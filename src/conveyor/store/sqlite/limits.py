"""FlowControlStore on SQLite: rate and concurrency limits and throttles."""

from __future__ import annotations

from datetime import datetime, timedelta

from conveyor.job import utcnow
from conveyor.limits import QueueLimits
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_set_params, limits_of_row
from conveyor.store.records import LimitChange, LimitStatus
from conveyor.store.sqlite.base import _Q, _dt, _dt_required, _ts
from conveyor.store.sqlite.core import CoreMixin


class LimitsMixin(CoreMixin):
    """Limits and throttles set, read and pruned (``FlowControlStore``)."""

    def limit_set(self, change: LimitChange, now: datetime) -> QueueLimits | None:
        params = limit_set_params(change, _ts(now))
        with self._write() as conn:
            conn.execute(_Q["limit_set"], params)
            conn.execute(_Q["limit_forget_empty"], {"queue": change.queue, "now": _ts(now)})
            row = conn.execute(_Q["limit_get"], {"queue": change.queue}).fetchone()
        return None if row is None else limits_of_row(row, _dt)

    def limit_get(self, queue: str) -> QueueLimits | None:
        row = self._conn().execute(_Q["limit_get"], {"queue": queue}).fetchone()
        return None if row is None else limits_of_row(row, _dt)

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        with self._write() as conn:
            when = now or utcnow()
            params = {
                "queue": queue,
                "key": limit_key,
                "until": _ts(when + timedelta(seconds=seconds)),
                "now": _ts(when),
            }
            if seconds <= 0:  # lift it
                conn.execute(_Q["limit_lift_queue" if limit_key is None else "limit_lift_key"],
                             params)  # fmt: skip
                conn.execute(_Q["limit_forget_empty"], params)
                return when
            if limit_key is None:
                until = conn.execute(_Q["limit_throttle_queue"], params).fetchone()[0]
            else:
                conn.execute(_Q["limit_ensure"], params)
                until = conn.execute(_Q["limit_throttle_key"], params).fetchone()[0]
        return _dt_required(until)

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        conn = self._conn()
        conn.execute("BEGIN")  # one read transaction: every figure of one moment
        try:
            return self._limit_usage(conn, now)
        finally:
            conn.execute("COMMIT")

    def limit_prune(self, now: datetime) -> None:
        params = {"now": _ts(now), "slack": LIMIT_SLACK_SECONDS}
        with self._write() as conn:
            conn.execute(_Q["limit_prune_all_starts"], params)
            conn.execute(_Q["limit_prune_throttles"], params)
            conn.execute(_Q["limit_prune_rows"], params)
