"""How the commands print: rich tables on a terminal, JSON on request, quiet progress when piped."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import click
from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from conveyor.encryption import SEALED_LABEL
from conveyor.expiry import is_expired
from conveyor.export import iso, job_dict
from conveyor.fleet import WorkerStatus
from conveyor.job import DETAILED_STATES, FILTER_STATES, Event, Job, JobState, is_sealed, utcnow
from conveyor.logs import spelled_duration
from conveyor.retain import describe_retain
from conveyor.store.records import QueueStats, Stats, Step

STATES = [str(s) for s in JobState]
#: What --state accepts: a state, or ready, scheduled or retrying (kinds of queued job).
STATE_CHOICES = list(FILTER_STATES)
#: Line width of tables written to a pipe or file.
PIPE_WIDTH = 200


def console() -> Console:
    """A console on the current stdout (read at each call, so a test runner can capture it).

    Piped output gets wide lines: a table folded to 80 columns defeats grep.
    """
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(file=sys.stdout, soft_wrap=True, width=width)


def interactive() -> bool:
    """Whether a person is watching: both streams on a terminal (a pipe gets no progress bars)."""
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while the block runs; yields ``advance(n)``. Silent when piped."""
    if not interactive():
        yield lambda n: None
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str))


# --- records as plain data (conveyor.export) -------------------------------------------


def worker_dict(status: WorkerStatus) -> dict[str, Any]:
    worker = status.info
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": worker.queues,
        "concurrency": status.concurrency,
        "quiet": status.quiet,
        "control": dict(worker.control),
        # The running jobs the store says it holds (what the dashboard counts too).
        "jobs_in_hand": len(status.jobs),
        "jobs": [job.id for job in status.jobs],
        "started_at": iso(worker.started_at),
        "last_seen_at": iso(worker.last_seen_at),
        "probably_dead": status.probably_dead,
    }


def stats_dict(
    stats: Stats, workers: Sequence[WorkerStatus], expired: dict[str, int] | None = None
) -> dict[str, Any]:
    return {
        "queues": {
            name: {
                "paused": q.paused,
                "counts": {state: q.counts.get(state, 0) for state in STATES},
                "detailed_counts": q.detailed_counts(),
                "oldest_ready_age": q.oldest_ready_age,
                # Of the scheduled and retrying: parked by a sleep or a wait (docs/durable.md).
                "parked": q.parked,
            }
            for name, q in stats.queues.items()
        },
        "finished_last_minute": stats.finished_last_minute,
        "workers": [worker_dict(w) for w in workers],
        "limits": _limits_dict(stats),
        # Kept jobs that were not started by their deadline (cancelled), per queue.
        "expired": expired or {},
    }


# --- tables ---------------------------------------------------------------------------
#
# Tables fit the terminal: every cell stays on one line (cut with an ellipsis),
# and below WIDE columns the least needed ones are left out; the queue overview
# is stacked, one short block per queue, when its table does not fit whole.

STATE_STYLE = {
    "waiting": "grey62",
    "queued": "cyan",
    "ready": "cyan",
    "scheduled": "blue",
    "retrying": "dark_orange",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "held": "bold yellow",  # a queued job an operator holds back (job.held)
}
#: From this width on, tables show every column.
WIDE = 110
#: Short headers of the detailed states, for the queue overview.
SHORT = {
    "waiting": "wait",
    "ready": "ready",
    "scheduled": "sched",
    "retrying": "retry",
    "running": "run",
    "succeeded": "done",
    "failed": "failed",
    "cancelled": "cancel",
}


def age(seconds: float | None) -> str:
    """A duration as the dashboard and the worker's log write it: 4.0 s, 3 min 12 s, 2 h 5 min."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return spelled_duration(seconds)


def when(value: datetime | None) -> str:
    """A time with its zone: ``2026-11-22 10:04:05 UTC``."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "-"


def short_when(value: datetime | None) -> str:
    """A time for a table cell, whose header names the zone (UTC): ``11-22 10:04:05``."""
    return value.strftime("%m-%d %H:%M:%S") if value is not None else "-"


def relative(value: datetime | None, now: datetime) -> str:
    """``in 59m12s`` or ``3m ago``."""
    if value is None:
        return "-"
    seconds = (value - now).total_seconds()
    return f"in {age(seconds)}" if seconds > 0 else f"{age(-seconds)} ago"


#: ``requests.exceptions.ConnectionError: ...``: an exception named with its module path.
_QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)(?=:|$)")


def first_line(text: str | None, width: int = 60) -> str:
    """The line of an error that says what happened (a traceback's last line).

    The exception is named without its module path (``ConnectionError: refused``,
    not ``requests.exceptions.ConnectionError: refused``): in a narrow column the
    path would leave no room for the message.
    """
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = _QUALIFIED.sub(r"\1", lines[-1].strip()) if lines else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _width() -> int:
    return console().width


@dataclass(frozen=True)
class Col:
    """A column of a fitted table: ``ratio`` 0 keeps its natural width, others share the rest."""

    header: str
    ratio: int = 0
    min_width: int = 4
    justify: JustifyMethod = "left"
    style: str | None = None
    #: Cut with an ellipsis when too long (error text); other columns with a
    #: ratio wrap instead, so a name is never cut.
    cut: bool = False


#: Per column: one space of padding each side, and the separator (a space).
_COLUMN_OVERHEAD = 3


def fitted_table(
    columns: Sequence[Col], rows: Sequence[Sequence[str | Text]], title: str | None = None
) -> Table:
    """A table as wide as the terminal at most.

    rich shrinks a too-wide table by narrowing the columns it may wrap, and
    squeezes the others to nothing when none may wrap; so each column gets its
    width here: fixed ones their natural width, the ``ratio`` ones (queue, task,
    error...) their share of the rest. Those wrap onto more lines (between
    words, a long name folded), so no name is cut; only ``cut`` ones (error
    text) are cut with an ellipsis.
    """
    naturals = natural_widths(columns, rows)
    room = _width() - _COLUMN_OVERHEAD * len(columns)
    widths = list(naturals)
    flexible = [i for i, col in enumerate(columns) if col.ratio]
    cut = [i for i in flexible if columns[i].cut]
    whole_first = sum(w for i, w in enumerate(widths) if i not in cut) + sum(
        columns[i].min_width for i in cut
    )
    if sum(widths) > room and cut and whole_first <= room:
        # Every name whole on its line; the cut columns (error text) share what is left.
        left = room - sum(w for i, w in enumerate(widths) if i not in cut)
        ratios = sum(columns[i].ratio for i in cut)
        for i in cut:
            share = left * columns[i].ratio // ratios
            widths[i] = max(columns[i].min_width, min(naturals[i], share))
    elif sum(widths) > room and flexible:
        fixed = sum(w for i, w in enumerate(widths) if i not in flexible)
        left = max(room - fixed, 0)
        ratios = sum(columns[i].ratio for i in flexible)
        shares = {i: left * columns[i].ratio // ratios for i in flexible}
        # A column that needs less than its share gives the rest to the others.
        spare = sum(shares[i] - naturals[i] for i in flexible if naturals[i] < shares[i])
        wanting = [i for i in flexible if naturals[i] > shares[i]]
        for i in flexible:
            if naturals[i] <= shares[i]:
                widths[i] = naturals[i]
            else:
                extra = spare * columns[i].ratio // max(sum(columns[j].ratio for j in wanting), 1)
                widths[i] = max(columns[i].min_width, min(naturals[i], shares[i] + extra))
    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, title=title, title_justify="left", show_edge=False
    )
    for col, width in zip(columns, widths, strict=True):
        wraps = bool(col.ratio) and not col.cut
        table.add_column(
            col.header,
            width=width,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            justify=col.justify,
            style=col.style,
        )
    for row in rows:
        # rich reads a str cell as markup: a name like "a[/]b" would raise, and
        # "[red]x[/red]" would show as "x". A cell is always its own text.
        table.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in row))
    return table


def natural_widths(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]]) -> list[int]:
    """Each column's width when nothing is cut."""
    return [
        max(cell_len(col.header), *(cell_len(_plain(row[i])) for row in rows), 1)
        for i, col in enumerate(columns)
    ]


def fits(columns: Sequence[Col], rows: Sequence[Sequence[str | Text]]) -> bool:
    """Whether a table shows every cell whole on the terminal."""
    needed = sum(natural_widths(columns, rows)) + _COLUMN_OVERHEAD * len(columns)
    return needed <= _width()


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def stats_view(
    stats: Stats, workers: Sequence[WorkerStatus], expired: dict[str, int] | None = None
) -> RenderableType:
    width = _width()
    # Parked jobs (of the scheduled and retrying) get a column when some queue has any.
    parked = any(q.parked for q in stats.queues.values())
    columns = [
        Col("queue", ratio=1, min_width=6),
        *(Col(state, justify="right", style=STATE_STYLE[state]) for state in DETAILED_STATES),
        *([Col("parked", justify="right")] if parked else []),
        Col("oldest ready", justify="right"),
        Col("paused"),
    ]
    rows: list[list[str | Text]] = []
    for name, q in stats.queues.items():
        counts = q.detailed_counts()
        rows.append(
            [
                name,
                *(f"{counts[state]:,}" for state in DETAILED_STATES),
                *([f"{q.parked:,}"] if parked else []),
                age(q.oldest_ready_age),
                "paused" if q.paused else "",
            ]
        )
    if not stats.queues:
        rows.append(["(no jobs)", *[""] * (len(DETAILED_STATES) + 2)])
    # A table when it fits whole; else one short block per queue.
    queues: RenderableType = (
        fitted_table(columns, rows, title="Queues")
        if fits(columns, rows)
        else _stacked_queues(stats)
    )
    throughput = Text(
        f"Throughput: {stats.finished_last_minute:,} jobs finished in the last minute "
        f"({stats.finished_last_minute / 60:.1f}/s)",
        no_wrap=True,
        overflow="ellipsis",
    )
    if expired:  # kept jobs that were not started by their deadline (they are cancelled)
        shown = ", ".join(f"{queue} {n:,}" for queue, n in sorted(expired.items()))
        throughput.append(f"\nExpired (never started, counted in cancelled): {shown}")
    names = ["worker", "queues", "jobs", "last seen"]
    if width >= WIDE:
        names[1:1] = ["host", "pid"]
    worker_rows: list[list[str | Text]] = []
    for status in workers:
        w = status.info
        dead = " (probably dead)" if status.probably_dead else ""
        seen = f"{age(status.silent_for)} ago{dead}"
        cells = {
            "worker": w.id,
            "host": w.host,
            "pid": str(w.pid),
            "queues": ",".join(w.queues),
            "jobs": f"{len(status.jobs)}/{w.concurrency}",
            "last seen": seen,
        }
        worker_rows.append([cells[c] for c in names])
    worker_columns = [Col(c, ratio=1 if c in ("worker", "queues") else 0) for c in names]
    live: RenderableType
    if fits(worker_columns, worker_rows):
        live = fitted_table(worker_columns, worker_rows, title=f"Workers: {len(workers)}")
    else:  # a block per worker: its id whole on a line of its own
        lines = [Text(f"Workers: {len(workers)}", style="italic")]
        for status in workers:
            w = status.info
            dead = " (probably dead)" if status.probably_dead else ""
            lines.append(Text(w.id, style="bold"))
            lines.append(
                Text(
                    f"  {len(status.jobs)}/{w.concurrency} jobs, last seen "
                    f"{age(status.silent_for)} ago{dead}; queues {', '.join(w.queues)}"
                )
            )
        live = stacked(lines)
    limits = _limits_view(stats)
    return Group(queues, *([limits] if limits is not None else []), throughput, live)


def _limits_view(stats: Stats) -> RenderableType | None:
    from conveyor.cli.limits import limits_view  # it uses this module's helpers

    return limits_view(stats.limits)


def _limits_dict(stats: Stats) -> dict[str, Any]:
    from conveyor.cli.limits import limits_dict  # it uses this module's helpers

    return limits_dict(stats.limits)


def _stacked_queues(stats: Stats) -> RenderableType:
    """The queue overview for a narrow terminal: a name line, then its counts on one line."""
    parts: list[Text] = [Text("Queues", style="italic")]
    if not stats.queues:
        parts.append(Text("(no jobs)"))
    for name, q in stats.queues.items():
        parts.extend(_queue_lines(name, q))
    return stacked(parts)


def stacked(lines: Sequence[Text]) -> Table:
    """Lines as wide as the terminal, each wrapped (between words; a long name folded).

    In a grid, not printed alone: the console soft-wraps (a pipe gets long lines
    for grep), which would leave a long line to the terminal to cut or break.
    """
    grid = Table.grid()
    grid.add_column(width=_width(), overflow="fold")
    for line in lines:
        grid.add_row(line)
    return grid


def _queue_lines(name: str, q: QueueStats) -> list[Text]:
    counts = q.detailed_counts()
    title = Text(name, style="bold")  # the whole name, on more lines if need be
    if q.paused:
        title.append("  paused", style="magenta")
    title.append(f"  oldest ready {age(q.oldest_ready_age)}")
    line = Text("  ")
    for state in DETAILED_STATES:
        line.append(f"{SHORT[state]} ", style="dim")
        line.append(f"{counts[state]:,}", style=STATE_STYLE[state])
        line.append("  ")
    if q.parked:  # of the scheduled and retrying: parked by a sleep or a wait
        line.append("parked ", style="dim")
        line.append(f"{q.parked:,}")
    line.rstrip()
    return [title, line]


def jobs_table(jobs: Sequence[Job]) -> Table:
    """A line per job when queue and task fit whole beside the error, else a block per job.

    Wide: fixed columns at their width, queue, task and error share the rest.
    Narrow (80 columns, or names too long): id, state, tries and time, then one column that holds
    "queue · task" on its first line and the error's message below, wrapped:
    names are never cut, and the message is shown whole (its first 200 characters).
    """
    now = utcnow()
    wide = _width() >= WIDE
    rows: list[tuple[Job, str, str]] = []
    for job in jobs:
        shown_at = job.finished_at
        if job.state == JobState.QUEUED:
            shown_at = job.run_at
        elif job.state == JobState.RUNNING:
            shown_at = job.started_at
        state = "held" if job.held else job.detailed_state(now)
        rows.append((job, state, short_when(shown_at)))
    table_columns = [
        Col("id", justify="right"),
        Col("queue", ratio=1, min_width=5),
        Col("task", ratio=2, min_width=6),
        Col("state"),
        Col("tries", justify="right"),
        Col("created (UTC)"),
        Col("next/ended (UTC)"),
        Col("error", ratio=3, min_width=12, cut=True),
    ]
    lines: list[list[str | Text]] = [
        [
            str(job.id),
            job.queue,
            job.task,
            Text(state, style=STATE_STYLE[state]),
            f"{job.attempts}/{job.max_attempts}",
            short_when(job.created_at),
            at,
            first_line(job.error, 200),
        ]
        for job, state, at in rows
    ]
    # A line per job only while every name fits whole beside 20 characters of error.
    widths = natural_widths(table_columns, lines)
    needed = sum(widths[:-1]) + min(widths[-1], 20) + _COLUMN_OVERHEAD * len(table_columns)
    if not wide or needed > _width():
        narrow: list[list[str | Text]] = []
        for job, state, at in rows:
            what = Text(f"{job.queue} · {job.task}")
            error = first_line(job.error, 200)
            if error:
                what.append("\n" + error, style="red")
            narrow.append(
                [
                    str(job.id),
                    Text(state, style=STATE_STYLE[state]),
                    f"{job.attempts}/{job.max_attempts}",
                    at,
                    what,
                ]
            )
        columns = [
            Col("id", justify="right"),
            Col("state"),
            Col("tries", justify="right"),
            Col("when (UTC)"),
            Col("queue · task / error", ratio=1, min_width=16),
        ]
        return fitted_table(columns, narrow)
    return fitted_table(table_columns, lines)


def counts_view(counts: dict[str, int]) -> Table:
    """Jobs per detailed state, and their total."""
    rows: list[list[str | Text]] = [
        [Text(state, style=STATE_STYLE[state]), f"{counts[state]:,}"]
        for state in DETAILED_STATES
        if counts.get(state)
    ]
    rows.append([Text("total", style="bold"), f"{sum(counts.values()):,}"])
    return fitted_table([Col("state"), Col("jobs", justify="right")], rows)


def relatives_text(jobs: Sequence[Job], now: datetime) -> Text:
    """Jobs as "12 succeeded, 13 running": a job's parents or children."""
    text = Text()
    for job in jobs:
        if text:
            text.append(", ")
        state = job.detailed_state(now)
        text.append(f"{job.id} ")
        text.append(state, style=STATE_STYLE[state])
    return text


def job_view(
    job: Job,
    events: Sequence[Event],
    steps: Sequence[Step] = (),
    parents: Sequence[Job] = (),
    children: Sequence[Job] = (),
    expires_at: datetime | None = None,
    kept: Mapping[str, timedelta] | None = None,
) -> RenderableType:
    now = utcnow()
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold", no_wrap=True)
    fields.add_column(overflow="fold")
    data = job_dict(job)
    times = {"run_at", "created_at", "started_at", "finished_at"}
    running = job.state == JobState.RUNNING
    for name in (
        "id", "queue", "task", "state", "attempts", "priority", "key", "limit_key", "group",
        "batch", "run_at", "created_at", "started_at", "finished_at", "worker",
        "cancel_requested", "progress", "progress_message",
    ):  # fmt: skip
        value = data[name]
        if name in ("key", "limit_key", "group", "batch") and value is None:
            value = "-"  # every field of a job, set or not
        if value is None or (name.startswith("progress") and not running):
            continue  # progress is shown while the job runs; after, under its history
        if name == "attempts":
            value = f"{job.attempts} of {job.max_attempts}"
        elif name == "state":
            state = job.detailed_state(now)
            value = Text(state, style=STATE_STYLE[state])
            if job.held:
                value = Text("held", style="bold yellow")
                value.append(" (queued; no worker claims it until `conveyor jobs unhold`)")
            elif state != str(job.state):
                value.append(f" (queued, due {relative(job.run_at, now)})", style="dim")
        elif name in times:
            stamp = getattr(job, name)
            value = f"{when(stamp)} ({relative(stamp, now)})"
        label = "next run" if name == "run_at" and job.state == JobState.QUEUED else name
        fields.add_row(label, value if isinstance(value, Text) else Text(str(value)))
        if name == "run_at" and expires_at is not None:  # its deadline to start by
            gone = "expired: never started" if is_expired(job) else relative(expires_at, now)
            fields.add_row("expires", Text(f"{when(expires_at)} ({gone})"))
    if kept:  # its own retention, over the queue's policy
        fields.add_row("kept", Text(f"{describe_retain(kept)} after it finishes"))
    if parents:
        fields.add_row("waits for" if job.state == JobState.WAITING else "waited for",
                       relatives_text(parents, now))  # fmt: skip
    if children:
        fields.add_row("waited for by", relatives_text(children, now))
    parts: list[RenderableType] = [fields, Text("")]
    parts.append(Text("args:   ", style="bold") + _value_text(job.args_json, data["args"]))
    parts.append(Text("kwargs: ", style="bold") + _value_text(job.kwargs_json, data["kwargs"]))
    if data["headers"]:
        parts.append(Text("headers: ", style="bold") + Text(json.dumps(data["headers"])))
    if job.result_json is not None:
        parts.append(Text("result: ", style="bold") + _value_text(job.result_json, data["result"]))
    if job.error:
        parts.append(Text(""))
        # A job that succeeded or waits for a retry keeps the error of an earlier attempt.
        label = "error:" if job.state == JobState.FAILED else "error of an earlier attempt:"
        label = "expired:" if is_expired(job) else label
        parts.append(Text(label, style="bold red"))
        parts.append(Text(job.error.rstrip()))
    columns = [
        Col("seq", justify="right"),
        Col("at (UTC)"),
        Col("kind"),
        Col("attempt", justify="right"),
        Col("worker", ratio=1, min_width=6),
        Col("error", ratio=2, min_width=12, cut=True),
    ]
    rows: list[list[str | Text]] = [
        [
            str(event.seq),
            event.at.strftime("%m-%d %H:%M:%S.%f")[:-3],
            event.kind,
            str(event.attempt),
            event.worker or "",
            first_line(event.error, 200),
        ]
        for event in events
    ]
    parts.extend([Text(""), fitted_table(columns, rows, title="Events")])
    if steps:
        parts.extend([Text(""), steps_table(steps)])
    if not running and (job.progress is not None or job.progress_message):
        last = " ".join(
            str(part) for part in (_percent(job.progress), job.progress_message) if part
        )
        parts.append(Text(f"last progress reported while it ran: {last}", style="dim"))
    return Group(*parts)


def _value_text(stored: str | None, decoded: Any) -> Text:
    """A job's value in the text view: its JSON, or that it is encrypted."""
    if is_sealed(stored):
        return Text(SEALED_LABEL, style="yellow")
    return Text(json.dumps(decoded))


def steps_table(steps: Sequence[Step]) -> RenderableType:
    """A job's durable steps: name, the attempt that ran it, when, how long, its result."""
    columns = [
        Col("step", ratio=1, min_width=6),
        Col("attempt", justify="right"),
        Col("finished (UTC)"),
        Col("took", justify="right"),
        Col("result", ratio=2, min_width=12, cut=True),
    ]
    rows: list[list[str | Text]] = [
        [
            step.name,
            str(step.attempt),
            step.finished_at.strftime("%m-%d %H:%M:%S.%f")[:-3],
            f"{(step.finished_at - step.started_at).total_seconds() * 1000:.0f} ms",
            # One line: JSON text escapes its newlines.
            SEALED_LABEL if is_sealed(step.result_json) else step.result_json[:200],
        ]
        for step in steps
    ]
    return fitted_table(columns, rows, title="Steps")


def _percent(value: Any) -> str:
    """A progress fraction as a percentage ("" for anything that is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return ""
    return f"{min(1.0, max(0.0, float(value))) * 100:.0f} %"
