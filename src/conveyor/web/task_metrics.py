"""The tasks page: per queue and task, throughput, failures, queue wait and run time
(p50/p95/p99) over the last hour, day or week, read from the per-task metrics the
store folds (``store/metrics_protocol.py``): a bounded number of rows whatever
the number of jobs, so the page costs the same at a thousand and at ten million.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.app import App
from conveyor.job import utcnow
from conveyor.store.metrics_protocol import (
    DAY,
    HOUR,
    MINUTE,
    SIX_HOURS,
    TEN_MINUTES,
    MetricsQuery,
    TaskMetricRow,
    TaskMetricsStore,
    fold_for_reading,
    histogram,
    percentiles,
    span_start,
)
from conveyor.web import charts
from conveyor.web.params import BadRequest

#: Each window: the span of its charts' rows (a point each), its length, and the
#: span of the rows its table reads: the coarsest that tiles it, so that a
#: table of many tasks reads few rows (it covers the window from the start of
#: the row holding its beginning, and says so).
WINDOWS: dict[str, tuple[int, timedelta, int]] = {
    "hour": (MINUTE, timedelta(hours=1), TEN_MINUTES),
    "day": (HOUR, timedelta(days=1), SIX_HOURS),
    "week": (HOUR, timedelta(days=7), DAY),
}
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
#: The outcomes stacked in the throughput chart, bottom up.
FINISHED = ("succeeded", "failed", "cancelled")


def latency(value: float | None) -> str:
    """A latency as people read it: 840 µs, 12 ms, 3.4 s, 2 min 5 s."""
    if value is None:
        return "—"
    if value < 0.001:
        return f"{value * 1_000_000:.0f} µs"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@dataclass(frozen=True, slots=True)
class TaskLine:
    """One row of the tasks table."""

    queue: str
    task: str
    finished: int
    failed: int
    retried: int
    per_hour: float
    run: dict[str, str]
    wait: dict[str, str]


def _count(rows: list[TaskMetricRow], series: str) -> int:
    return sum(r.jobs for r in rows if r.series == series)


def _quantiles(rows: list[TaskMetricRow], series: str) -> dict[str, str]:
    found = percentiles(histogram(rows, series), list(QUANTILES.values()))
    return {name: latency(value) for name, value in zip(QUANTILES, found, strict=True)}


def task_lines(rows: list[TaskMetricRow], length: timedelta) -> list[TaskLine]:
    """A line per task, ``length`` being how long the rows cover (for the rate)."""
    by_task: dict[tuple[str, str], list[TaskMetricRow]] = {}
    for row in rows:
        by_task.setdefault((row.queue, row.task), []).append(row)
    hours = length.total_seconds() / 3600
    lines = []
    for (queue, task), of_task in sorted(by_task.items()):
        finished = sum(_count(of_task, s) for s in FINISHED)
        lines.append(
            TaskLine(
                queue=queue,
                task=task,
                finished=finished,
                failed=_count(of_task, "failed"),
                retried=_count(of_task, "retried"),
                per_hour=finished / hours,
                run=_quantiles(of_task, "run"),
                wait=_quantiles(of_task, "wait"),
            )
        )
    return lines


def context(
    store: TaskMetricsStore, now: datetime, window: str, queue: str | None, task: str | None
) -> dict[str, Any]:
    """What tasks.html shows for a window and a selection (None: every queue, task)."""
    if window not in WINDOWS:
        raise BadRequest(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    fold_for_reading(store, now)
    span, length, table_span = WINDOWS[window]
    last = span_start(now, span)
    slots = int(length.total_seconds()) // span
    starts = [last - span * (slots - 1 - i) for i in range(slots)]
    since = datetime.fromtimestamp(starts[0], UTC)
    shown = "%H:%M" if span == MINUTE else "%a %H:00"
    titles = [datetime.fromtimestamp(s, UTC).strftime(shown) + " UTC" for s in starts]
    index = {start: i for i, start in enumerate(starts)}

    table_start = span_start(now - length, table_span)
    table_since = datetime.fromtimestamp(table_start, UTC)
    table_rows = store.task_metrics_read(MetricsQuery(table_span, table_since, "task"))
    lines = task_lines(table_rows, max(now - table_since, timedelta(minutes=1)))
    if task is not None and queue is None:
        # One task across its queues: one range of rows per queue (the rows are
        # ordered by queue, then task), not a scan of every task's rows.
        per_time = [
            row
            for q in sorted({line.queue for line in lines if line.task == task})
            for row in store.task_metrics_read(MetricsQuery(span, since, "time", q, task))
        ]
    else:
        per_time = store.task_metrics_read(MetricsQuery(span, since, "time", queue, task))
    by_slot: list[list[TaskMetricRow]] = [[] for _ in starts]
    for row in per_time:
        if row.start in index:
            by_slot[index[row.start]].append(row)

    finished = {s: [_count(rows, s) for rows in by_slot] for s in FINISHED}
    failures = {
        "failed": [_count(rows, "failed") for rows in by_slot],
        "retried": [_count(rows, "retried") for rows in by_slot],
    }

    def quantile_lines(series: str) -> dict[str, list[float | None]]:
        hists = [histogram(rows, series) for rows in by_slot]
        found = [percentiles(h, list(QUANTILES.values())) for h in hists]
        return {name: [f[k] for f in found] for k, name in enumerate(QUANTILES)}

    width, height = 720, 120
    return {
        "window": window,
        "windows": list(WINDOWS),
        "queue": queue,
        "task": task,
        "lines": lines,
        "queues": sorted({line.queue for line in lines} | ({queue} if queue else set())),
        "tasks": sorted({line.task for line in lines} | ({task} if task else set())),
        "table_since": table_since.strftime("%a %H:%M UTC"),
        "slot": "minute" if span == MINUTE else "hour",
        "first_title": titles[0],
        "throughput": charts.stacked_bars(finished, titles, width, height),
        "failures": charts.stacked_bars(failures, titles, width, 60),
        "run_chart": charts.log_lines(quantile_lines("run"), titles, width, height, latency),
        "wait_chart": charts.log_lines(quantile_lines("wait"), titles, width, height, latency),
        "latency": latency,
        "totals": {
            "finished": sum(line.finished for line in lines),
            "failed": sum(line.failed for line in lines),
        },
    }


def page_context(app: App, params: Mapping[str, str]) -> dict[str, Any]:
    """The tasks page's context from its query (window, queue, task)."""
    store = app.task_metrics
    if store is None:
        raise BadRequest(f"{app.description} keeps no per-task metrics")
    window = params.get("window") or "hour"
    return context(store, utcnow(), window, params.get("queue") or None, params.get("task") or None)
