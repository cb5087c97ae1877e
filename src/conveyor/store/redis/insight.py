"""InsightStore on Redis: the dashboard's figures, /metrics and the event feed."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from conveyor.job import Event
from conveyor.store.records import EventCounts, EventOffset, FinishedCount, RunTimeBucket
from conveyor.store.redis.base import _event_and_start, _ts
from conveyor.store.redis.core import CoreMixin
from conveyor.store.redis.history import run_times, slot_counts


def _event_of(entry: tuple[str, dict[str, str]]) -> Event:
    return _event_and_start(entry)[0]


class InsightMixin(CoreMixin):
    """Figures read for charts and metrics (``InsightStore``)."""

    def event_since(self, seq: int, limit: int) -> list[Event]:
        entries = self._do(
            lambda: self._client.xrange(self._k("events"), f"({seq}-0", "+", count=limit)
        )
        return [_event_of(e) for e in entries]

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        counts = slot_counts(self, _ts(since), since.timestamp(), slot.total_seconds())
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for (q, s, i), c in counts.items()]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        counts: dict[tuple[str, str], int] = {}
        last = after[1]
        while True:
            with self._guard():
                entries = self._client.xrange(self._k("events"), f"({last}-0", "+", count=5000)
            if not entries:
                break
            for entry in entries:
                e = _event_of(entry)
                counts[(e.queue, e.kind)] = counts.get((e.queue, e.kind), 0) + 1
                last = e.seq
        return EventCounts(counts=counts, offset=(0, last))

    def queue_names(self) -> list[str]:
        return self._queue_names()

    def event_offset(self) -> EventOffset:
        newest = self._do(lambda: self._client.xrevrange(self._k("events"), "+", "-", count=1))
        return (0, int(newest[0][0].split("-", 1)[0])) if newest else (0, 0)

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        buckets = run_times(self, f"({_ts(finished_after)}", _ts(finished_until), bounds)
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=s)
            for (q, b), (c, s) in buckets.items()
        ]
