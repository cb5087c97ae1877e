"""InsightStore on PostgreSQL: the dashboard's figures, /metrics and the event feed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from conveyor.job import Event
from conveyor.store.postgres.base import _Q, _row_to_event
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.records import EventCounts, EventOffset, FinishedCount, RunTimeBucket


class InsightMixin(CoreMixin):
    """Figures read for charts and metrics (``InsightStore``)."""

    def event_since(self, seq: int, limit: int) -> list[Event]:
        with self._conn() as conn:
            rows = conn.execute(_Q["event_since"], {"seq": seq, "limit": limit})
            return [_row_to_event(r) for r in rows]

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        params = {"since": since, "slot": slot.total_seconds()}
        with self._conn() as conn:
            rows = conn.execute(_Q["stats_finished_per_slot"], params).fetchall()
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for q, s, i, c in rows]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        params = {"xid": after[0], "seq": after[1]}
        with self._tx() as conn:
            # Planned for the offset: generically, the events after "some offset"
            # are a third of the table, and the plan read all of them.
            conn.execute(_Q["plan_for_values"])
            rows = conn.execute(_Q["event_count_by_kind"], params).fetchall()
        counts: dict[tuple[str, str], int] = {}
        last = after
        for queue, kind, count, (xid, seq) in rows:
            counts[(queue, kind)] = count
            last = max(last, (int(xid), int(seq)))
        return EventCounts(counts=counts, offset=last)

    def queue_names(self) -> list[str]:
        with self._conn() as conn:
            return [row[0] for row in conn.execute(_Q["queue_names"]).fetchall()]

    def event_offset(self) -> EventOffset:
        with self._conn() as conn:
            row = conn.execute(_Q["event_offset"]).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        params = {"after": finished_after, "until": finished_until, "bounds": list(bounds)}
        with self._conn() as conn:
            rows = conn.execute(_Q["job_run_time_histogram"], params).fetchall()
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=float(s)) for q, b, c, s in rows
        ]
