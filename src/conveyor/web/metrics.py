"""/metrics in the Prometheus text format (version 0.0.4), written by hand.

By hand rather than through prometheus_client: with a collector of ours (the
values live in the store, so the library's own Counter and Gauge objects do not
fit), the library's writer made a scrape 3 ms slower at ten million jobs on
SQLite (10.6 ms against 7.6, the store's reads being the same); see
BENCHMARKS.md. Tests read this text with prometheus_client's parser.

Gauges (jobs per queue and state, oldest ready age, paused, workers) are read
fresh on every scrape. Counters and the run-time histogram count what happens
from this process's first scrape on, as an application's own counters would
(Prometheus's rate() and increase() expect a restart to start them again):
each scrape reads only what is new since the previous one, the events after
the last one counted and the jobs that ended since the last window, so a
scrape stays cheap on a database of millions of jobs (counting all of history
at the first scrape took 10+ s at a million jobs). ``conveyor_up`` says whether
the store answered; while it does not, a scrape holds that gauge alone, at 0.
"""

from __future__ import annotations

import math
import threading
from datetime import datetime, timedelta

from starlette.responses import PlainTextResponse, Response

from conveyor.app import App
from conveyor.job import EventKind, JobState, utcnow
from conveyor.store.records import EventOffset
from conveyor.web.limits import limit_metrics

#: Upper bounds (seconds) of the run-time histogram's buckets.
RUN_TIME_BOUNDS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
)  # fmt: skip
#: Jobs that ended less than this long ago wait for the next scrape: a worker's
#: transaction can commit a moment after the ``now`` it wrote as finished_at.
COMMIT_LAG = timedelta(seconds=5)
#: Event kinds exposed as counters, and the metric each one feeds.
COUNTED_KINDS = {
    EventKind.ENQUEUED: ("conveyor_jobs_enqueued_total", "Jobs enqueued."),
    EventKind.SUCCEEDED: ("conveyor_jobs_succeeded_total", "Jobs completed successfully."),
    EventKind.FAILED: ("conveyor_jobs_failed_total", "Jobs failed for good."),
    EventKind.RETRIED: (
        "conveyor_jobs_retried_total",
        "Failed attempts queued again with backoff.",
    ),
    EventKind.RESCUED: (
        "conveyor_jobs_rescued_total",
        "Running jobs whose lease expired (their worker was lost).",
    ),
    EventKind.MANUAL_RETRY: (
        "conveyor_jobs_manually_retried_total",
        "Failed or cancelled jobs queued again by hand.",
    ),
    EventKind.CANCELLED: ("conveyor_jobs_cancelled_total", "Jobs cancelled."),
}


#: The Prometheus text format's content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UP_HELP = "1 when the store answered this scrape, 0 when it cannot be reached."


class Metrics:
    """The counters and histogram of one dashboard process, and the text of a scrape."""

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
        now = utcnow()
        stats = self.app.stats()
        workers = self.app.workers()
        with self._lock:  # two scrapes at once must not count the same events twice
            self._catch_up(now)
            events = dict(self._events)
            buckets = {q: list(b) for q, b in self._buckets.items()}
            sums = dict(self._sums)

        out: list[str] = []
        family(out, "conveyor_up", "gauge", UP_HELP)
        sample(out, "conveyor_up", {}, 1)
        family(out, "conveyor_jobs", "gauge", "Jobs in the store by queue and state.")
        for name, q in stats.queues.items():
            for state in JobState:
                count = q.counts.get(str(state), 0)
                sample(out, "conveyor_jobs", {"queue": name, "state": str(state)}, count)
        family(
            out,
            "conveyor_queue_oldest_ready_age_seconds",
            "gauge",
            "How long the oldest ready job of the queue has waited (0 when none is ready).",
        )
        for name, q in stats.queues.items():
            age = q.oldest_ready_age or 0.0
            sample(out, "conveyor_queue_oldest_ready_age_seconds", {"queue": name}, age)
        family(out, "conveyor_queue_paused", "gauge", "1 when the queue is paused.")
        for name, q in stats.queues.items():
            sample(out, "conveyor_queue_paused", {"queue": name}, int(q.paused))
        family(out, "conveyor_workers", "gauge", "Workers registered and not yet forgotten.")
        sample(out, "conveyor_workers", {}, len(workers))
        family(
            out,
            "conveyor_worker_jobs_in_hand",
            "gauge",
            "Running jobs the workers of a host hold (as the workers page counts them).",
        )
        in_hand: dict[str, int] = {}
        for worker in workers:
            host = worker.info.host
            in_hand[host] = in_hand.get(host, 0) + len(worker.jobs)
        for host, count in sorted(in_hand.items()):
            sample(out, "conveyor_worker_jobs_in_hand", {"host": host}, count)

        limit_metrics(out, stats.limits, now)

        queues = sorted({q for q, _ in events} | set(stats.queues))
        for kind, (metric, help_text) in COUNTED_KINDS.items():
            family(out, metric, "counter", help_text)
            for queue in queues:
                sample(out, metric, {"queue": queue}, events.get((queue, str(kind)), 0))

        metric = "conveyor_job_run_seconds"
        family(out, metric, "histogram", "Run time of the last attempt of jobs that ended.")
        for queue in sorted(buckets):
            cumulative = 0
            for bound, count in zip([*RUN_TIME_BOUNDS, math.inf], buckets[queue], strict=True):
                cumulative += count
                le = "+Inf" if bound == math.inf else repr(bound)
                sample(out, f"{metric}_bucket", {"queue": queue, "le": le}, cumulative)
            sample(out, f"{metric}_sum", {"queue": queue}, sums.get(queue, 0.0))
            sample(out, f"{metric}_count", {"queue": queue}, cumulative)
        return "\n".join(out) + "\n"


def metrics_down() -> str:
    """A scrape while the store cannot be reached: the up gauge at 0, nothing else."""
    out: list[str] = []
    family(out, "conveyor_up", "gauge", UP_HELP)
    sample(out, "conveyor_up", {}, 0)
    return "\n".join(out) + "\n"


def metrics_response(text: str) -> Response:
    return PlainTextResponse(text, media_type=CONTENT_TYPE)


def family(out: list[str], name: str, kind: str, help_text: str) -> None:
    out.append(f"# HELP {name} {help_text}")
    out.append(f"# TYPE {name} {kind}")


def sample(out: list[str], name: str, labels: dict[str, str], value: float) -> None:
    if labels:
        inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
        out.append(f"{name}{{{inner}}} {format_value(value)}")
    else:
        out.append(f"{name} {format_value(value)}")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))
