"""Queue analytics: throughput, wait and run time percentiles, outcomes and top errors.

``report(spark, dsn)`` reads the last day of the jobs and events tables through
the ``conveyor`` data source and returns a :class:`Report` of three small
DataFrames:

``summary``, one row per (queue, task):
    ``attempts`` (attempts started: ended ones by their events, running ones by
    their jobs), ``succeeded``, ``failed``, ``cancelled``,
    ``retried`` (failed attempts queued again), ``rescued`` (leases that expired),
    ``snoozed``; ``finished`` = succeeded + failed + cancelled;
    ``throughput_per_minute`` = (succeeded + failed), that is jobs that ran to
    an end, per minute of the run: the whole minutes from the first such end
    of the (queue, task) in the window to its last, both counted (a run of 4
    minutes in a day's window is a rate of those 4 minutes, not of the day's
    1,440); ``peak_per_minute``, the busiest minute;
    ``success_rate`` and ``failure_rate`` over ``finished``, ``retry_rate`` and
    ``rescue_rate`` over ``attempts`` (null when there is nothing to divide by);
    ``wait_p50/p95/p99`` (seconds from created to started, for jobs started in
    the window) and ``run_p50/p95/p99`` (seconds from started to finished, for
    jobs finished in the window).
``throughput``, one row per minute, queue and task with jobs that ran to an end.
``errors``, the ten most frequent errors: errors are grouped by the last line
    of their text (for a traceback, the ``Exception: message`` line) with every
    run of digits read as one (``card of customer c00196 declined for 21.95``
    and ``... c00197 declined for 3.10`` are one error, ``pattern`` shows it
    with ``#`` for the numbers); per group its queue and task, the newest line
    (``error``), how many events carried it, on how many jobs, when it was last
    seen, and the newest full text.

Counts come from the events (the history), timings from the jobs table. A job
that was retried keeps the ``started_at`` of its last attempt, so its wait
time includes the earlier attempts and their backoff, and its run time is that
of the last attempt.

Percentiles are Spark's ``percentile_approx`` at accuracy 10,000: exact (an
observed value, never an interpolation) for groups of up to 10,000 jobs, and
within 1/10,000 of the rank beyond, so a report of millions of jobs stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from conveyor.job import EventKind, JobState

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

#: Percentiles of the wait and run times, as column suffixes and fractions.
PERCENTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
PERCENTILE_ACCURACY = 10_000
TOP_ERRORS = 10
#: Longest error line kept: a message that long has long stopped helping to group.
ERROR_LINE_CHARS = 300

_COUNTED_KINDS: dict[str, str] = {
    "attempts": EventKind.CLAIMED,
    "succeeded": EventKind.SUCCEEDED,
    "failed": EventKind.FAILED,
    "cancelled": EventKind.CANCELLED,
    "retried": EventKind.RETRIED,
    "rescued": EventKind.RESCUED,
    "snoozed": EventKind.SNOOZED,
}
#: Outcomes of a job that ran to an end: what throughput counts.
_RAN_TO_AN_END = (str(EventKind.SUCCEEDED), str(EventKind.FAILED))
_STARTED_STATES = [str(s) for s in JobState if s != JobState.QUEUED]
_TERMINAL_STATES = [str(JobState.SUCCEEDED), str(JobState.FAILED), str(JobState.CANCELLED)]


@dataclass(frozen=True)
class Report:
    """The analytics of one window, ``[start, end)``. The DataFrames are already computed."""

    start: datetime
    end: datetime
    summary: DataFrame
    throughput: DataFrame
    errors: DataFrame

    @property
    def minutes(self) -> float:
        return (self.end - self.start).total_seconds() / 60

    def write(self, out: str | Path) -> list[Path]:
        """Write the three tables as Parquet and the charts as PNG into ``out``; return the files.

        Parquet goes to ``out/summary``, ``out/throughput`` and ``out/errors``
        (folders of Parquet files, as Spark writes them; replaced when they
        exist), charts to ``out/throughput.png`` and ``out/latency.png``.
        """
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        written: list[Path] = []
        for name, frame in (
            ("summary", self.summary),
            ("throughput", self.throughput),
            ("errors", self.errors),
        ):
            target = folder / name
            frame.coalesce(1).write.mode("overwrite").parquet(str(target))
            written.append(target)
        written.append(
            throughput_chart(
                self.throughput.collect(), self.start, self.end, folder / "throughput.png"
            )
        )
        written.append(latency_chart(self.summary.collect(), folder / "latency.png"))
        return written


def report(
    spark: SparkSession,
    dsn: str,
    since: timedelta = timedelta(hours=24),
    out: str | Path | None = None,
    *,
    now: datetime | None = None,
) -> Report:
    """Analytics of the window ``[now - since, now)``, per queue and task (see the module).

    With ``out``, also writes them there as Parquet and PNG charts
    (:meth:`Report.write`). ``now`` defaults to the current time.
    """
    from conveyor.spark import read_table

    if since <= timedelta(0):
        raise ValueError(f"since must be a positive duration, got {since}")
    end = (now or datetime.now(UTC)).astimezone(UTC)
    start = end - since
    events = read_table(
        spark,
        dsn,
        "events",
        columns=["job_id", "queue", "task", "kind", "at", "error", "started_at"],
        at_since=start,
        at_until=end,
    )
    job_columns = ["queue", "task", "state", "created_at", "started_at", "finished_at"]
    started = read_table(
        spark,
        dsn,
        "jobs",
        columns=job_columns,
        state=_STARTED_STATES,
        started_at_since=start,
        started_at_until=end,
    )
    finished = read_table(
        spark,
        dsn,
        "jobs",
        columns=job_columns,
        state=_TERMINAL_STATES,
        finished_at_since=start,
        finished_at_until=end,
    )
    return build_report(events, started, finished, start, end, out=out)


def build_report(
    events: DataFrame,
    started: DataFrame,
    finished: DataFrame,
    start: datetime,
    end: datetime,
    out: str | Path | None = None,
) -> Report:
    """The report of DataFrames already limited to the window.

    ``events``: the events in the window; ``started``: jobs started in it (not
    queued); ``finished``: terminal jobs finished in it.
    """
    from pyspark import StorageLevel

    # Each input is read once: the three tables come from the same rows, so
    # they agree with each other even while workers keep writing.
    inputs = [frame.persist(StorageLevel.MEMORY_AND_DISK) for frame in (events, started, finished)]
    events, started, finished = inputs
    try:
        throughput = _throughput(events).localCheckpoint(eager=True)
        summary = _summary(events, started, finished, throughput)
        result = Report(
            start=start,
            end=end,
            summary=summary.localCheckpoint(eager=True),
            throughput=throughput,
            errors=_top_errors(events).localCheckpoint(eager=True),
        )
    finally:
        for frame in inputs:
            frame.unpersist()
    if out is not None:
        result.write(out)
    return result


def _seconds_between(earlier: str, later: str) -> Column:
    from pyspark.sql import functions as F

    # Microseconds keep sub-second timings exact; plain casts to long drop them.
    return (F.unix_micros(F.col(later)) - F.unix_micros(F.col(earlier))) / 1_000_000


def _minute(column: str) -> Column:
    from pyspark.sql import functions as F

    # Whole UTC minutes from epoch seconds: date_trunc would follow the session
    # time zone, whose offset is not always a whole number of minutes.
    return F.timestamp_seconds(F.floor(F.unix_seconds(F.col(column)) / 60) * 60)


def _throughput(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        events.where(F.col("kind").isin(*_RAN_TO_AN_END))
        .groupBy(_minute("at").alias("minute"), "queue", "task")
        .agg(F.count(F.lit(1)).alias("jobs"))
        .orderBy("minute", "queue", "task")
    )


def _percentiles(frame: DataFrame, value: Column, prefix: str) -> DataFrame:
    from pyspark.sql import functions as F

    fractions = [fraction for _, fraction in PERCENTILES]
    values = F.percentile_approx(value, fractions, PERCENTILE_ACCURACY)
    return (
        frame.groupBy("queue", "task")
        .agg(values.alias("_p"))
        .select(
            "queue",
            "task",
            *[F.col("_p")[i].alias(f"{prefix}_{name}") for i, (name, _) in enumerate(PERCENTILES)],
        )
    )


def _summary(
    events: DataFrame,
    started: DataFrame,
    finished: DataFrame,
    throughput: DataFrame,
) -> DataFrame:
    from pyspark.sql import functions as F

    def counted(name: str, kind: str) -> Column:
        if name != "attempts":
            return F.col("kind") == kind
        # An attempt that ended is on the event that ended it (its started_at);
        # histories written before that encoding have claimed events instead.
        return (F.col("kind") == kind) | F.col("started_at").isNotNull()

    counts = events.groupBy("queue", "task").agg(
        *[
            F.count(F.when(counted(name, str(kind)), True)).alias(name)
            for name, kind in _COUNTED_KINDS.items()
        ]
    )
    # Attempts still running have no event yet: their jobs' rows count them.
    running = (
        started.where(F.col("state") == str(JobState.RUNNING))
        .groupBy("queue", "task")
        .agg(F.count(F.lit(1)).alias("running_attempts"))
    )
    counts = (
        counts.join(running, ["queue", "task"], "full_outer")
        .fillna({"running_attempts": 0, **{name: 0 for name in _COUNTED_KINDS}})
        .withColumn("attempts", F.col("attempts") + F.col("running_attempts"))
        .drop("running_attempts")
    )
    minute = F.unix_seconds(F.col("minute"))
    peaks = throughput.groupBy("queue", "task").agg(
        F.max("jobs").alias("peak_per_minute"),
        # The minutes of the run: from the first minute a job ended to the last.
        ((F.max(minute) - F.min(minute)) / 60 + 1).alias("run_minutes"),
    )
    waits = _percentiles(
        started.where(F.col("started_at").isNotNull()),
        _seconds_between("created_at", "started_at"),
        "wait",
    )
    runs = _percentiles(
        finished.where(F.col("started_at").isNotNull()),
        _seconds_between("started_at", "finished_at"),
        "run",
    )
    joined = (
        counts.join(waits, ["queue", "task"], "full_outer")
        .join(runs, ["queue", "task"], "full_outer")
        .join(peaks, ["queue", "task"], "left_outer")
    )
    zeros: dict[str, bool | float | int | str] = {
        name: 0 for name in [*_COUNTED_KINDS, "peak_per_minute"]
    }
    joined = joined.fillna(zeros)

    def ratio(numerator: Column, denominator: Column) -> Column:
        return F.when(denominator > 0, numerator / denominator)

    finished_count = F.col("succeeded") + F.col("failed") + F.col("cancelled")
    ran = F.col("succeeded") + F.col("failed")
    return joined.select(
        "queue",
        "task",
        "attempts",
        "succeeded",
        "failed",
        "cancelled",
        "retried",
        "rescued",
        "snoozed",
        finished_count.alias("finished"),
        F.coalesce(ran / F.col("run_minutes"), F.lit(0.0)).alias("throughput_per_minute"),
        F.col("peak_per_minute").cast("long").alias("peak_per_minute"),
        ratio(F.col("succeeded"), finished_count).alias("success_rate"),
        ratio(F.col("failed"), finished_count).alias("failure_rate"),
        ratio(F.col("retried"), F.col("attempts")).alias("retry_rate"),
        ratio(F.col("rescued"), F.col("attempts")).alias("rescue_rate"),
        *[f"wait_{name}" for name, _ in PERCENTILES],
        *[f"run_{name}" for name, _ in PERCENTILES],
    ).orderBy("queue", "task")


def _top_errors(events: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    # The last non-blank line names the exception of a traceback ("ValueError:
    # bad size"); the frames above it differ by line numbers and would split
    # one error into many.
    line = F.trim(F.regexp_extract(F.col("error"), r"([^\n]*\S[^\n]*)\s*$", 1))
    return (
        events.where(F.col("error").isNotNull())
        .withColumn("line", F.substring(line, 1, ERROR_LINE_CHARS))
        # Ids, amounts and sizes in a message would make each failure its own error.
        .withColumn("pattern", F.regexp_replace("line", r"[0-9]+", "#"))
        .groupBy("queue", "task", "pattern")
        .agg(
            F.max_by("line", "at").alias("error"),
            F.count(F.lit(1)).alias("count"),
            F.count_distinct("job_id").alias("jobs"),
            F.max("at").alias("last_seen"),
            F.max_by("error", "at").alias("latest_text"),
        )
        .orderBy(F.desc("count"), F.desc("last_seen"), "queue", "task", "pattern")
        .limit(TOP_ERRORS)
        .select("queue", "task", "error", "pattern", "count", "jobs", "last_seen", "latest_text")
    )


def format_seconds(value: float | None) -> str:
    """A duration for people: 850 ms, 12.3 s, 4.5 min, 2.1 h; a dash when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


# --- charts -------------------------------------------------------------------
#
# Drawn on a bare matplotlib Figure (the Agg renderer behind savefig), never
# through pyplot: no global backend to switch, no display needed, and nothing
# left open in a long-lived process.

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (0.001, "ms"))
#: More groups than this make a latency chart unreadable: the busiest are kept.
MAX_CHART_GROUPS = 20


def _unit_for(seconds: float) -> tuple[float, str]:
    for size, name in _UNITS:
        if seconds >= 2 * size:
            return size, name
    return _UNITS[-1]


def throughput_chart(rows: list[Row], start: datetime, end: datetime, path: Path) -> Path:
    """Jobs that ran to an end per minute, stacked by queue, as a PNG."""
    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5), layout="constrained")
    ax = fig.add_subplot()
    # Beyond two days, minute points blur into noise: average them per hour.
    bucket = timedelta(hours=1) if end - start > timedelta(days=2) else timedelta(minutes=1)
    first = _floor(start, bucket)
    slots = int((end - first) / bucket) + 1
    edges = [first + i * bucket for i in range(slots)]
    series: dict[str, list[float]] = {}
    for row in rows:
        # collect() gives naive local times; astimezone reads them as such.
        moment = row["minute"].astimezone(UTC)
        slot = int((moment - first) / bucket)
        if 0 <= slot < slots:
            values = series.setdefault(str(row["queue"]), [0.0] * slots)
            # Every slot is zero until a row says otherwise: no line drawn across a gap.
            values[slot] += row["jobs"] * (timedelta(minutes=1) / bucket)
    xs = [_days(edge) for edge in edges]
    if series:
        names = sorted(series)
        # Stacked: each band is a queue, the top edge is the total of all queues.
        ax.stackplot(
            xs,
            [series[name] for name in names],
            labels=names,
            alpha=0.85,
            step="post",
        )
        fig.legend(loc="outside right upper", frameon=False, title="queue")
        ax.set_ylim(bottom=0)
    else:
        ax.text(
            0.5, 0.5, "No job finished in this window", ha="center", va="center",
            transform=ax.transAxes, color="0.4", fontsize=13,
        )  # fmt: skip
    ax.set_xlim(xs[0], _days(end))
    window = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC"
    fig.suptitle("Throughput by queue", fontsize=14)
    ax.set_title(window, fontsize=10, color="0.35")
    ax.set_xlabel("Time (UTC)")
    per = "jobs per minute, hourly mean" if bucket > timedelta(minutes=1) else "jobs per minute"
    ax.set_ylabel(f"Jobs finished ({per})")
    # matplotlib's stubs leave these constructors unannotated.
    locator = mdates.AutoDateLocator(tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    formatter = mdates.ConciseDateFormatter(locator, tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(formatter)
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    fig.savefig(path, dpi=120)
    return path


def _days(moment: datetime) -> float:
    """matplotlib's date number: days since its default epoch, 1970-01-01 UTC."""
    return (moment.astimezone(UTC) - _EPOCH) / timedelta(days=1)


def _floor(moment: datetime, bucket: timedelta) -> datetime:
    return _EPOCH + ((moment.astimezone(UTC) - _EPOCH) // bucket) * bucket


def latency_chart(rows: list[Row], path: Path) -> Path:
    """Wait and run time p50/p95/p99 per queue and task, side by side, as a PNG."""
    from matplotlib.figure import Figure

    groups = [r for r in rows if r["wait_p50"] is not None or r["run_p50"] is not None]
    groups.sort(key=lambda r: -(r["attempts"] or 0))
    groups = sorted(groups[:MAX_CHART_GROUPS], key=lambda r: (r["queue"], r["task"]))
    height = max(3.5, 1.2 + 0.55 * len(groups))
    fig = Figure(figsize=(12, height), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    labels = [f"{r['queue']} / {r['task']}" for r in groups]
    colors = {"p50": "#4C72B0", "p95": "#DD8452", "p99": "#C44E52"}
    bar = 0.26
    for ax, prefix, title, nothing in (
        (axes[0], "wait", "Wait time (created \u2192 started)", "No job started in this window"),
        (axes[1], "run", "Run time (started \u2192 finished)", "No job finished in this window"),
    ):
        values = [r[f"{prefix}_{name}"] for r in groups for name, _ in PERCENTILES]
        known = [v for v in values if v is not None]
        size, unit = _unit_for(max(known) if known else 0.0)
        for offset, (name, _) in enumerate(PERCENTILES):
            ys = [i + (offset - 1) * bar for i in range(len(groups))]
            raw = [r[f"{prefix}_{name}"] for r in groups]
            xs = [(v or 0.0) / size for v in raw]
            bars = ax.barh(ys, xs, height=bar, label=name, color=colors[name])
            ax.bar_label(
                bars, labels=[format_seconds(v) for v in raw], padding=3, fontsize=8, color="0.25"
            )
        # Room on the right for the value labels.
        ax.set_xlim(0, max(known) / size * 1.18 if known and max(known) > 0 else 1)
        ax.set_title(title, fontsize=12)
        ax.set_xlabel(f"Duration ({unit})")
        ax.grid(True, axis="x", alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if not known:
            ax.text(
                0.5, 0.5, nothing, ha="center", va="center",
                transform=ax.transAxes, color="0.4", fontsize=12,
            )  # fmt: skip
            ax.set_xticks([])
    axes[0].set_yticks(range(len(groups)), labels)
    axes[0].set_ylabel("Queue / task")
    axes[0].invert_yaxis()
    if groups:
        # Empty bar groups draw no patch: a legend of them would show the wrong colours.
        handles, names = axes[0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncol=3, frameon=False)
    fig.suptitle("Latency percentiles by queue and task", fontsize=14)
    fig.savefig(path, dpi=120)
    return path
