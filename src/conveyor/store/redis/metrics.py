"""Per-task metrics on Redis: a hash per span and start, folded from the event stream.

A mixin of RedisStore (its ``_run``, ``_do``, ``_k`` and client); the fold is
``scripts/task_metrics_fold.lua``. Hashes ``tm:60:<start>`` and
``tm:3600:<start>`` expire when they are no longer read and are listed by start
in ``tm:starts:<span>``; ``tm:0:0`` holds the totals. A read walks the starts of
its window (at most the rows ``KEPT`` of one span), whatever the number of jobs.
See ``conveyor.store.metrics_protocol``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TypeVar

from conveyor.store.metrics_protocol import (
    BOUNDS,
    FOLD_LIMIT,
    KEPT,
    SPANS,
    TOTAL,
    MetricsQuery,
    TaskMetricRow,
    span_start,
)
from conveyor.store.redis.base import RedisBase

_T = TypeVar("_T")
_BOUNDS_ARG = ",".join(repr(b) for b in BOUNDS)
_KEPT_ARG = json.dumps({str(span): int(kept.total_seconds()) for span, kept in KEPT.items()})


class RedisTaskMetrics(RedisBase):
    """TaskMetricsStore for RedisStore (each span's hashes expire, and its index is
    pruned, as ``KEPT`` says)."""

    def task_metrics_fold(self, limit: int = FOLD_LIMIT) -> int:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        return int(self._run("task_metrics_fold", str(limit), _BOUNDS_ARG, _KEPT_ARG))

    def task_metrics_read(self, query: MetricsQuery) -> list[TaskMetricRow]:
        span, queue, task = query.span, query.queue, query.task
        if span not in SPANS:
            raise ValueError(f"span must be one of {SPANS}, got {span!r}")

        def read() -> list[tuple[int, dict[str, str]]]:
            if span == TOTAL:
                return [(0, self._client.hgetall(self._k("tm", "0", "0")))]
            index = self._k("tm", "starts", str(span))
            first = span_start(query.since, span)
            starts = [int(s) for s in self._client.zrangebyscore(index, first, "+inf")]
            pipe = self._client.pipeline(transaction=False)
            for start in starts:
                pipe.hgetall(self._k("tm", str(span), str(start)))
            return list(zip(starts, pipe.execute(), strict=True))

        sums: dict[tuple[int, str, str, str, int], list[float]] = {}
        for start, fields in self._do(read):
            for name, value in fields.items():
                q, t, series, bucket = json.loads(name[1:])
                if query.per == "time":
                    # The rows metrics.sql's task_metrics_per_time chooses.
                    if task is not None:
                        chosen = t == task and queue in (None, q)
                    else:
                        chosen = q == (queue or "") and t == ""
                    key = (start, "", "", series, bucket)
                else:
                    chosen = t != "" and queue in (None, q) and task in (None, t)
                    key = (0, q, t, series, bucket)
                if not chosen:
                    continue
                got = sums.setdefault(key, [0, 0.0])
                got[0 if name[0] == "n" else 1] += float(value)
        return [
            TaskMetricRow(start, q, t, series, bucket, int(n), seconds)
            for (start, q, t, series, bucket), (n, seconds) in sums.items()
        ]

    def task_metrics_prune(self, now: datetime) -> int:
        def prune() -> int:
            gone = 0
            for span, kept in KEPT.items():
                index = self._k("tm", "starts", str(span))
                cutoff = span_start(now - kept, span)
                old = self._client.zrangebyscore(index, "-inf", f"({cutoff}")
                if old:
                    gone += int(self._client.delete(*(self._k("tm", str(span), s) for s in old)))
                    self._client.zremrangebyscore(index, "-inf", f"({cutoff}")
            return gone

        return self._do(prune)
