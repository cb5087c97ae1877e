"""Per-task metrics: what the stores fold from their events, and how it is read.

A fold reads the events written since the previous fold (never the jobs'
history) and adds them to rows keyed by (span, start, queue, task, series,
bucket):

- span: 60, 600, 3600, 21600 or 86400 seconds (each kept as ``KEPT`` says),
  or 0 (one row since the schema was made, never pruned: the counters of
  ``/metrics``). Charts read minute rows (the last hour) and hour rows (the
  last day and week); the per-task table of a window reads the coarsest rows
  that tile it (ten minutes, six hours, days), so a page reads a few thousand
  rows however many tasks run every minute;
- queue and task: each sample is also added to its queue's row of every task
  (task '') and to the row of every queue (queue '' and task ''), so that a
  chart of all tasks reads one row per slot, not one per task;
- series: an event kind (enqueued, succeeded, failed, cancelled, retried,
  rescued, manual_retry; bucket 0), or ``run`` / ``wait``, histograms whose
  bucket is an index into ``BOUNDS`` and whose seconds are the sum of the
  samples.

Run time: from an attempt's start to its end, for attempts that ended
succeeded, failed or retried. Queue wait: from the moment the job became due
(its ``run_at``) to the start of the attempt that ended it; read from the job
at fold time, so an attempt whose job has moved on (queued again, running again,
deleted) gives no wait sample. A page reads a bounded number of rows whatever
the number of jobs: at most (queues x tasks x series x buckets) per minute or
hour shown.

The fold is not on any job's path: enqueue, claim and finish write nothing
more. The dashboard's reads and ``/metrics`` fold before they read, and
maintenance may call ``task_metrics_fold`` and ``task_metrics_prune``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

#: Upper bounds (seconds) of the run-time and wait histograms: log-spaced, each
#: sqrt(2) times the one before, from 1 ms to about 4.7 hours. A bucket holds
#: samples above the bound before it and at most its own; ``len(BOUNDS)`` holds
#: those above the last. A percentile read from them is within a factor of
#: sqrt(2) of the true one.
BOUNDS: tuple[float, ...] = tuple(round(0.001 * 2 ** (i / 2), 9) for i in range(49))
#: The spans a fold writes, and one row since the start (TOTAL).
MINUTE, TEN_MINUTES, HOUR, SIX_HOURS, DAY, TOTAL = 60, 600, 3600, 21600, 86400, 0
SPANS = (MINUTE, TEN_MINUTES, HOUR, SIX_HOURS, DAY, TOTAL)
#: How long the rows of each span are kept (a week's window and then some).
KEPT: dict[int, timedelta] = {
    MINUTE: timedelta(hours=2),
    TEN_MINUTES: timedelta(hours=2),
    HOUR: timedelta(days=8),
    SIX_HOURS: timedelta(days=2),
    DAY: timedelta(days=8),
}
#: Events one fold reads at most (a read after a long quiet folds in steps): on
#: SQLite a fold holds the write lock, so a worker waits at most one such step.
FOLD_LIMIT = 5_000
#: The event kinds counted per task.
COUNTED_KINDS = (
    "enqueued",
    "succeeded",
    "failed",
    "cancelled",
    "retried",
    "rescued",
    "manual_retry",
)
HISTOGRAMS = ("run", "wait")

Grouping = Literal["task", "time"]


@dataclass(frozen=True, slots=True)
class TaskMetricRow:
    """One folded figure: ``jobs`` samples of a series (and their ``seconds``).

    Read grouped by task (``start`` 0: over the whole window; the rows of
    every task, '', left out) or by time (``queue`` and ``task`` '': the
    selection's rows).
    """

    start: int
    queue: str
    task: str
    series: str
    bucket: int
    jobs: int
    seconds: float


@dataclass(frozen=True, slots=True)
class MetricsQuery:
    """A read of the folded rows: those of ``span`` from ``since`` on (any start
    for span 0), grouped ``per`` task (of ``queue`` and ``task`` when given),
    summed over time; or per start, of the selection: one task (of one queue or
    of all), every task of one queue, or everything."""

    span: int
    since: datetime
    per: Grouping
    queue: str | None = None
    task: str | None = None

    def statement(self) -> str:
        """The SQL stores' statement for this read (in their ``metrics.sql``)."""
        if self.per == "task":
            return "task_metrics_per_task"
        if self.task is not None and self.queue is None:
            return "task_metrics_per_time_of_task"
        return "task_metrics_per_time"

    def params(self) -> dict[str, Any]:
        """The parameters of ``statement()``: a read per start of every task of a
        queue (or of everything) reads the rows of task '' (and queue '')."""
        queue, task = self.queue, self.task
        if self.per == "time" and task is None:
            queue, task = queue or "", ""
        since = span_start(self.since, self.span) if self.span else 0
        return {"span": self.span, "since": since, "queue": queue, "task": task}

    def rows(self, found: Iterable[Sequence[Any]]) -> list[TaskMetricRow]:
        """The SQL stores' result rows of ``statement()`` as records."""
        if self.per == "task":
            return [TaskMetricRow(0, q, t, s, b, n, sec) for q, t, s, b, n, sec in found]
        return [TaskMetricRow(start, "", "", s, b, n, sec) for start, s, b, n, sec in found]


@runtime_checkable
class TaskMetricsStore(Protocol):
    """A store that folds its events into per-task metrics (see the module)."""

    def task_metrics_fold(self, limit: int = FOLD_LIMIT) -> int:
        """Fold up to ``limit`` events written since the last fold; how many were
        read (0 also when another fold held the offset)."""
        ...

    def task_metrics_read(self, query: MetricsQuery) -> list[TaskMetricRow]:
        """The rows the query asks for (see ``MetricsQuery``)."""
        ...

    def task_metrics_prune(self, now: datetime) -> int:
        """Drop rows older than ``KEPT`` says; how many went."""
        ...


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a sample (as the stores' folds compute it)."""
    for i, bound in enumerate(BOUNDS):
        if seconds <= bound:
            return i
    return len(BOUNDS)


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram, interpolated inside its bucket on a
    log scale (the bounds are log-spaced); None without samples."""
    return percentiles(counts, (q,))[0]


def percentiles(counts: Sequence[int], qs: Sequence[float]) -> list[float | None]:
    """Several quantiles (ascending) of a histogram in one pass, as ``percentile``."""
    total = sum(counts)
    if total == 0:
        return [None] * len(qs)
    found: list[float | None] = []
    seen = 0
    i = 0
    for q in qs:
        rank = q * total
        while i < len(counts) and (counts[i] == 0 or seen + counts[i] < rank):
            seen += counts[i]
            i += 1
        if i >= len(BOUNDS):
            found.append(BOUNDS[-1])
        elif i == 0:
            found.append(BOUNDS[0])
        else:
            lower, upper = BOUNDS[i - 1], BOUNDS[i]
            share = (rank - seen) / counts[i]
            found.append(math.exp(math.log(lower) + share * (math.log(upper) - math.log(lower))))
    return found


def histogram(rows: Iterable[TaskMetricRow], series: str) -> list[int]:
    """The bucket counts of one histogram series, summed over ``rows``."""
    counts = [0] * (len(BOUNDS) + 1)
    for row in rows:
        if row.series == series and 0 <= row.bucket <= len(BOUNDS):
            counts[row.bucket] += row.jobs
    return counts


def span_start(moment: datetime, span: int) -> int:
    """The start (epoch seconds) of the row of ``span`` holding ``moment``."""
    seconds = int(moment.timestamp())
    return seconds - seconds % span


def prune_cutoffs(now: datetime) -> dict[str, int]:
    """The start before which each span's rows go, as the prune statements take them."""
    return {f"before_{span}": span_start(now - kept, span) for span, kept in KEPT.items()}


#: How often a reader prunes (see fold_for_reading), per store, in this process.
PRUNE_EVERY = timedelta(minutes=10)
_pruned: dict[int, float] = {}


def fold_for_reading(store: TaskMetricsStore, now: datetime) -> None:
    """What a reader does before it reads: fold the events written since the last
    fold, and, at most every PRUNE_EVERY, drop the rows no longer kept (so that
    the rows stay bounded even where no maintenance prunes them)."""
    store.task_metrics_fold()
    moment = now.timestamp()
    if moment - _pruned.get(id(store), 0.0) >= PRUNE_EVERY.total_seconds():
        _pruned[id(store)] = moment
        store.task_metrics_prune(now)
