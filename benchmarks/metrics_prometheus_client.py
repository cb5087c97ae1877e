"""/metrics through ``prometheus_client`` and a collector of ours: what the dashboard's hand-written
text was measured against (benchmarks/dashboard.py), and kept as the faster.

The same reads as conveyor.web.metrics; only the writing of the text differs.
Originally: /metrics in the Prometheus text format, through prometheus_client.

A custom collector (not the library's Counter and Gauge objects) because the
values live in the store, not in this process: each scrape reads them and
hands them to the library as metric families, which it writes out.

Gauges (jobs per queue and state, oldest ready age, paused, workers, limits)
are read fresh on every scrape. Counters and the run-time histogram count what
happens from this process's first scrape on, as an application's own counters
would (Prometheus's rate() and increase() expect a restart to start them
again): each scrape reads only what is new since the previous one, the events
after the last one counted and the jobs that ended since the last window, so a
scrape stays cheap on a database of millions of jobs (counting all of history
at the first scrape took 10+ s at a million jobs). ``conveyor_up`` says whether
the store answered; while it does not, a scrape holds that gauge alone, at 0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from conveyor.app import App
from conveyor.job import JobState, utcnow
from conveyor.store.records import EventOffset, LimitStatus

# The same metrics as the dashboard's text: its tables, not copies of them.
from conveyor.web.limits import LIMIT_GAUGES
from conveyor.web.metrics import COUNTED_KINDS, UP_HELP

#: As the dashboard's counters were when they were measured against this: kept by
#: the process, run times of jobs that ended (5 ms to 1 h), late commits waited for.
RUN_TIME_BOUNDS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
)  # fmt: skip
COMMIT_LAG = timedelta(seconds=5)


class Metrics(Collector):
    """The counters and histogram of one dashboard process, and the families of a scrape."""

    def __init__(self, app: App, commit_lag: timedelta = COMMIT_LAG) -> None:
        self.app = app
        self.commit_lag = commit_lag
        self._lock = threading.Lock()
        #: None until the first scrape, which starts the counters at the newest event.
        self._offset: EventOffset | None = None
        self._events: dict[tuple[str, str], int] = {}
        self._window_end = utcnow()  # set again by the first scrape
        # queue -> per-bucket counts (last one above every bound), sum of seconds.
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        # auto_describe off: registering must not scrape the store.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def _catch_up(self, now: datetime) -> None:
        store = self.app.store
        until = now - self.commit_lag
        if self._offset is None:
            self._offset = store.event_offset()
            self._window_end = until
            return
        counted = store.event_count_by_kind(self._offset)
        for key, count in counted.counts.items():
            self._events[key] = self._events.get(key, 0) + count
        self._offset = counted.offset
        if until > self._window_end:
            for row in store.job_run_time_histogram(self._window_end, until, RUN_TIME_BOUNDS):
                buckets = self._buckets.setdefault(row.queue, [0] * (len(RUN_TIME_BOUNDS) + 1))
                buckets[min(row.bucket, len(RUN_TIME_BOUNDS))] += row.count
                self._sums[row.queue] = self._sums.get(row.queue, 0.0) + row.total_seconds
            self._window_end = until

    def render(self) -> str:
        """One scrape, as text (a store that cannot be reached raises, as its calls do)."""
        return generate_latest(self.registry).decode("utf-8")

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape: every read first, so a failing one yields nothing."""
        now = utcnow()
        stats = self.app.stats()
        workers = self.app.workers()
        with self._lock:  # two scrapes at once must not count the same events twice
            self._catch_up(now)
            events = dict(self._events)
            buckets = {q: list(b) for q, b in self._buckets.items()}
            sums = dict(self._sums)

        families: list[Metric] = []
        up = GaugeMetricFamily("conveyor_up", UP_HELP)
        up.add_metric([], 1)
        families.append(up)
        jobs = GaugeMetricFamily(
            "conveyor_jobs", "Jobs in the store by queue and state.", labels=["queue", "state"]
        )
        for name, q in stats.queues.items():
            for state in JobState:
                jobs.add_metric([name, str(state)], q.counts.get(str(state), 0))
        families.append(jobs)
        age = GaugeMetricFamily(
            "conveyor_queue_oldest_ready_age_seconds",
            "How long the oldest ready job of the queue has waited (0 when none is ready).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "conveyor_queue_paused", "1 when the queue is paused.", labels=["queue"]
        )
        for name, q in stats.queues.items():
            age.add_metric([name], q.oldest_ready_age or 0.0)
            paused.add_metric([name], int(q.paused))
        families += [age, paused]
        count = GaugeMetricFamily("conveyor_workers", "Workers registered and not yet forgotten.")
        count.add_metric([], len(workers))
        in_hand = GaugeMetricFamily(
            "conveyor_worker_jobs_in_hand",
            "Running jobs the workers of a host hold (as the workers page counts them).",
            labels=["host"],
        )
        per_host: dict[str, int] = {}
        for worker in workers:
            host = worker.info.host
            per_host[host] = per_host.get(host, 0) + len(worker.jobs)
        for host, n in sorted(per_host.items()):
            in_hand.add_metric([host], n)
        families += [count, in_hand]

        families += limit_families(stats.limits, now)

        queues = sorted({q for q, _ in events} | set(stats.queues))
        for kind, (metric, help_text) in COUNTED_KINDS.items():
            counter = CounterMetricFamily(metric, help_text, labels=["queue"])
            for queue in queues:
                counter.add_metric([queue], events.get((queue, str(kind)), 0))
            families.append(counter)

        histogram = HistogramMetricFamily(
            "conveyor_job_run_seconds",
            "Run time of the last attempt of jobs that ended.",
            labels=["queue"],
        )
        for queue in sorted(buckets):
            cumulative = 0
            points: list[tuple[str, float]] = []
            for bound, n in zip([*RUN_TIME_BOUNDS, math.inf], buckets[queue], strict=True):
                cumulative += n
                points.append(("+Inf" if bound == math.inf else repr(bound), cumulative))
            histogram.add_metric([queue], points, sum_value=sums.get(queue, 0.0))
        families.append(histogram)
        yield from families


#: The labels of a limit's own gauges.
LABELS = ["queue", "scope"]


def limit_families(limits: dict[str, LimitStatus], now: datetime) -> list[Metric]:
    """The limit gauges of /metrics."""
    rate = GaugeMetricFamily(
        "conveyor_limit_rate", "Jobs a rate limit lets start per window.", labels=LABELS
    )
    window = GaugeMetricFamily(
        "conveyor_limit_rate_window_seconds", "The window of a rate limit.", labels=LABELS
    )
    concurrency = GaugeMetricFamily(
        "conveyor_limit_concurrency", "Jobs a concurrency limit lets run at once.", labels=LABELS
    )
    for s in limits.values():
        for scope, limit in (("queue", s.limit), ("key", s.key_limit)):
            if limit is not None and limit.rate is not None:
                rate.add_metric([s.queue, scope], limit.rate.count)
                window.add_metric([s.queue, scope], limit.rate.per)
            if limit is not None and limit.concurrency is not None:
                concurrency.add_metric([s.queue, scope], limit.concurrency)
    families: list[Metric] = [rate, window, concurrency]
    for name, help_text, field in LIMIT_GAUGES:
        gauge = GaugeMetricFamily(name, help_text, labels=["queue"])
        for s in limits.values():
            gauge.add_metric([s.queue], getattr(s, field))
        families.append(gauge)
    throttled = GaugeMetricFamily(
        "conveyor_limit_throttled_seconds",
        "Seconds until the queue's throttle ends (0 when it is not throttled).",
        labels=["queue"],
    )
    for s in limits.values():
        left = (s.throttled_until - now).total_seconds() if s.throttled_until else 0.0
        throttled.add_metric([s.queue], max(0.0, left))
    families.append(throttled)
    return families
