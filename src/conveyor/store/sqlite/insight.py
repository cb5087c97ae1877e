"""InsightStore on SQLite: the dashboard's figures, /metrics and the event feed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from conveyor.job import Event
from conveyor.store.records import EventCounts, EventOffset, FinishedCount, RunTimeBucket
from conveyor.store.sqlite.base import _Q, _row_to_event, _ts
from conveyor.store.sqlite.core import CoreMixin


class InsightMixin(CoreMixin):
    """Figures read for charts and metrics (``InsightStore``)."""

    def event_since(self, seq: int, limit: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_since"], {"seq": seq, "limit": limit})
        return [_row_to_event(r) for r in rows]

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        params = {"since": _ts(since), "slot": slot.total_seconds()}
        rows = self._conn().execute(_Q["stats_finished_per_slot"], params)
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for q, s, i, c in rows]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        rows = self._conn().execute(_Q["event_count_by_kind"], {"after_seq": after[1]})
        counts: dict[tuple[str, str], int] = {}
        last = after[1]
        for queue, kind, count, max_seq in rows:
            counts[(queue, kind)] = count
            last = max(last, max_seq)
        return EventCounts(counts=counts, offset=(0, last))

    def queue_names(self) -> list[str]:
        return self._queue_names()

    def event_offset(self) -> EventOffset:
        xid, seq = self._conn().execute(_Q["event_offset"]).fetchone()
        return (int(xid), int(seq))

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        params = {
            "after": _ts(finished_after),
            "until": _ts(finished_until),
            "bounds": json.dumps(list(bounds)),
        }
        rows = self._conn().execute(_Q["job_run_time_histogram"], params)
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=float(s)) for q, b, c, s in rows
        ]
