"""/metrics in the Prometheus text format (version 0.0.4), written by hand.

By hand rather than through prometheus_client: with a collector of ours (the
values live in the store, so the library's own Counter and Gauge objects do not
fit), the library's writer made a scrape 3 ms slower at ten million jobs on
SQLite (10.6 ms against 7.6, the store's reads being the same); see
BENCHMARKS.md. Tests read this text with prometheus_client's parser.

Gauges (jobs per queue and state, oldest ready age, paused, workers) are read
fresh on every scrape. Counters and histograms are read from the store: the
per-task metrics it folds from its events (``store/metrics_protocol.py``), in
their total rows, so two dashboards, or ``conveyor metrics`` beside one, give
every scraper the same values, and a restart of either changes none. Each scrape
folds the events written since the previous fold first (a bounded step: see
FOLD_LIMIT), so it stays cheap on a database of millions of jobs. Labelled by
queue and task. ``conveyor_up`` says whether the store answered; while it does
not, a scrape holds that gauge alone, at 0.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from starlette.responses import PlainTextResponse, Response

from conveyor.app import App
from conveyor.job import JobState, utcnow
from conveyor.store.expiring import expired_counts
from conveyor.store.metrics_protocol import (
    BOUNDS,
    TOTAL,
    MetricsQuery,
    TaskMetricRow,
    fold_for_reading,
)
from conveyor.version import __version__
from conveyor.web.fair import fair_metrics
from conveyor.web.limits import limit_metrics

#: The histograms' bounds as exposed: every fourth of the store's (each four
#: times the one before, 1 ms to 4.7 h), to keep the number of series down.
EXPOSED_BOUNDS: tuple[float, ...] = BOUNDS[::4]
#: Each exposed bound: its le label, and the store's buckets at most it.
_EXPOSED = [(repr(b), BOUNDS.index(b) + 1) for b in EXPOSED_BOUNDS] + [("+Inf", len(BOUNDS) + 1)]
#: Event kinds exposed as counters, and the metric each one feeds.
COUNTED_KINDS = {
    "enqueued": ("conveyor_jobs_enqueued_total", "Jobs enqueued."),
    "succeeded": ("conveyor_jobs_succeeded_total", "Jobs completed successfully."),
    "failed": ("conveyor_jobs_failed_total", "Jobs failed for good."),
    "retried": ("conveyor_jobs_retried_total", "Failed attempts queued again with backoff."),
    "rescued": (
        "conveyor_jobs_rescued_total",
        "Running jobs whose lease expired (their worker was lost).",
    ),
    "manual_retry": (
        "conveyor_jobs_manually_retried_total",
        "Failed or cancelled jobs queued again by hand.",
    ),
    "cancelled": ("conveyor_jobs_cancelled_total", "Jobs cancelled."),
}
HISTOGRAMS = {
    "run": (
        "conveyor_job_run_seconds",
        "Run time of attempts that ended succeeded, failed or retried.",
    ),
    "wait": (
        "conveyor_job_queue_wait_seconds",
        "Queue wait: from a job's due time to the start of the attempt that ended it.",
    ),
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


#: The Prometheus text format's content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UP_HELP = "1 when the store answered this scrape, 0 when it cannot be reached."


class Metrics:
    """The text of a scrape, every value read from the store."""

    def __init__(self, app: App) -> None:
        self.app = app

    def totals(self) -> list[TaskMetricRow]:
        """The store's total rows per task, after folding what is new (none on a store
        that does not fold per-task metrics)."""
        store = self.app.task_metrics
        if store is None:
            return []
        fold_for_reading(store, utcnow())
        return store.task_metrics_read(MetricsQuery(TOTAL, EPOCH, "task"))

    def render(self) -> str:
        now = utcnow()
        stats = self.app.stats()
        workers = self.app.workers()
        rows = self.totals()

        out: list[str] = []
        family(out, "conveyor_up", "gauge", UP_HELP)
        sample(out, "conveyor_up", {}, 1)
        family(out, "conveyor_build_info", "gauge", "Always 1; the version serving this scrape.")
        sample(out, "conveyor_build_info", {"version": __version__}, 1)
        family(out, "conveyor_jobs", "gauge", "Jobs in the store by queue and state.")
        for name, q in stats.queues.items():
            for state in JobState:
                count = q.counts.get(str(state), 0)
                sample(out, "conveyor_jobs", {"queue": name, "state": str(state)}, count)
        family(
            out,
            "conveyor_jobs_parked",
            "gauge",
            "Queued jobs parked by ctx.sleep, ctx.wait_for or ctx.wait, not due yet.",
        )
        for name, q in stats.queues.items():
            sample(out, "conveyor_jobs_parked", {"queue": name}, q.parked)
        family(
            out,
            "conveyor_queue_oldest_ready_age_seconds",
            "gauge",
            "How long the oldest ready job of the queue has waited (0 when none is ready).",
        )
        for name, q in stats.queues.items():
            age = q.oldest_ready_age or 0.0
            sample(out, "conveyor_queue_oldest_ready_age_seconds", {"queue": name}, age)
        expired = expired_counts(self.app.expiry)
        if expired is not None:
            family(
                out,
                "conveyor_jobs_expired",
                "gauge",
                "Jobs kept that expired: not started by their deadline (cancelled).",
            )
            for name in sorted(set(stats.queues) | set(expired)):
                sample(out, "conveyor_jobs_expired", {"queue": name}, expired.get(name, 0))
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
        fair_metrics(out, self.app)
        task_counters(out, rows)
        task_histograms(out, rows)
        return "\n".join(out) + "\n"


def task_counters(out: list[str], rows: list[TaskMetricRow]) -> None:
    """One counter per counted kind, per queue and task (0 where a task has none)."""
    tasks = sorted({(r.queue, r.task) for r in rows})
    counts = {(r.queue, r.task, r.series): r.jobs for r in rows if r.series in COUNTED_KINDS}
    for kind, (metric, help_text) in COUNTED_KINDS.items():
        family(out, metric, "counter", help_text)
        for queue, task in tasks:
            labels = {"queue": queue, "task": task}
            sample(out, metric, labels, counts.get((queue, task, kind), 0))


def task_histograms(out: list[str], rows: list[TaskMetricRow]) -> None:
    """Run time and queue wait per queue and task, cumulative over EXPOSED_BOUNDS.

    Written with the labels of each task escaped once: a store of many tasks has
    thousands of these lines, and they are most of a scrape's time.
    """
    for series, (metric, help_text) in HISTOGRAMS.items():
        family(out, metric, "histogram", help_text)
        per_task: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        for r in rows:
            if r.series != series:
                continue
            counts, total = per_task.setdefault((r.queue, r.task), ([0] * (len(BOUNDS) + 1), [0.0]))
            counts[min(r.bucket, len(BOUNDS))] += r.jobs
            total[0] += r.seconds
        for (queue, task), (counts, total) in sorted(per_task.items()):
            labels = f'queue="{escape_label(queue)}",task="{escape_label(task)}"'
            cumulative = list(itertools.accumulate(counts))
            for le, upto in _EXPOSED:
                out.append(f'{metric}_bucket{{{labels},le="{le}"}} {cumulative[upto - 1]}')
            out.append(f"{metric}_sum{{{labels}}} {format_value(total[0])}")
            out.append(f"{metric}_count{{{labels}}} {cumulative[-1]}")


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
