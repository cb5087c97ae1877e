"""How the commands print: rich tables on a terminal, JSON on request, quiet progress when piped."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from conveyor.job import Event, Job, JobState, utcnow
from conveyor.store.base import Stats, WorkerInfo

STATES = [str(s) for s in JobState]
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


# --- records as plain data ------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _decoded(text: str | None) -> Any:
    """A stored JSON payload, decoded; as the raw text when it is not JSON (a poison job)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def job_dict(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "state": str(job.state),
        "args": _decoded(job.args_json),
        "kwargs": _decoded(job.kwargs_json),
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "group": job.group,
        "batch": job.batch,
        "run_at": _iso(job.run_at),
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "worker": job.worker,
        "lease_expires_at": _iso(job.lease_expires_at),
        "cancel_requested": job.cancel_requested,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "result": _decoded(job.result_json),
        "error": job.error,
    }


def event_dict(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "attempt": event.attempt,
        "worker": event.worker,
        "at": _iso(event.at),
        "error": event.error,
    }


def worker_dict(worker: WorkerInfo) -> dict[str, Any]:
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "queues": worker.queues,
        "concurrency": worker.concurrency,
        "jobs_in_hand": worker.jobs_in_hand,
        "started_at": _iso(worker.started_at),
        "last_seen_at": _iso(worker.last_seen_at),
    }


def stats_dict(stats: Stats, workers: Sequence[WorkerInfo]) -> dict[str, Any]:
    return {
        "queues": {
            name: {
                "paused": q.paused,
                "counts": {state: q.counts.get(state, 0) for state in STATES},
                "oldest_ready_age": q.oldest_ready_age,
            }
            for name, q in stats.queues.items()
        },
        "finished_last_minute": stats.finished_last_minute,
        "workers": [worker_dict(w) for w in workers],
    }


# --- tables --------------------------------------------------------------------------

STATE_STYLE = {
    "queued": "cyan",
    "running": "yellow",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def age(seconds: float | None) -> str:
    """A short human duration: 4s, 3m12s, 2h05m, 3d04h."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


def first_line(text: str | None, width: int = 60) -> str:
    """The line of an error that says what happened (a traceback's last line)."""
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def stats_view(stats: Stats, workers: Sequence[WorkerInfo]) -> RenderableType:
    queues = Table(title="Queues", title_justify="left")
    queues.add_column("queue")
    for state in STATES:
        queues.add_column(state, justify="right", style=STATE_STYLE[state])
    queues.add_column("oldest ready", justify="right")
    queues.add_column("paused")
    for name, q in stats.queues.items():
        queues.add_row(
            name,
            *(f"{q.counts.get(state, 0):,}" for state in STATES),
            age(q.oldest_ready_age),
            "paused" if q.paused else "",
        )
    if not stats.queues:
        queues.add_row("(no jobs)", *[""] * (len(STATES) + 2))
    throughput = Text(
        f"Throughput: {stats.finished_last_minute:,} jobs finished in the last minute "
        f"({stats.finished_last_minute / 60:.1f}/s)"
    )
    live = Table(title=f"Live workers: {len(workers)}", title_justify="left")
    for column in ("worker", "host", "pid", "queues", "jobs in hand", "last seen"):
        live.add_column(column)
    now = utcnow()
    for w in workers:
        live.add_row(
            w.id,
            w.host,
            str(w.pid),
            ",".join(w.queues),
            f"{w.jobs_in_hand}/{w.concurrency}",
            age((now - w.last_seen_at).total_seconds()) + " ago",
        )
    return Group(queues, throughput, live)


def jobs_table(jobs: Sequence[Job]) -> Table:
    table = Table()
    for column in ("id", "queue", "task", "state", "attempts", "created", "finished", "error"):
        table.add_column(column, justify="right" if column in ("id", "attempts") else "left")
    for job in jobs:
        table.add_row(
            str(job.id),
            job.queue,
            job.task,
            Text(str(job.state), style=STATE_STYLE[str(job.state)]),
            f"{job.attempts}/{job.max_attempts}",
            when(job.created_at),
            when(job.finished_at),
            first_line(job.error),
        )
    return table


def job_view(job: Job, events: Sequence[Event]) -> RenderableType:
    fields = Table.grid(padding=(0, 2))
    fields.add_column(style="bold")
    fields.add_column()
    data = job_dict(job)
    for name in (
        "id", "queue", "task", "state", "attempts", "priority", "key", "group",
        "batch", "run_at", "created_at", "started_at", "finished_at", "worker",
        "cancel_requested", "progress", "progress_message",
    ):  # fmt: skip
        value = data[name]
        if value is None:
            continue
        if name == "attempts":
            value = f"{job.attempts} of {job.max_attempts}"
        elif name == "state":
            value = Text(str(job.state), style=STATE_STYLE[str(job.state)])
        fields.add_row(name, value if isinstance(value, Text) else Text(str(value)))
    parts: list[RenderableType] = [fields, Text("")]
    parts.append(Text("args:   ", style="bold") + Text(json.dumps(data["args"])))
    parts.append(Text("kwargs: ", style="bold") + Text(json.dumps(data["kwargs"])))
    if job.result_json is not None:
        parts.append(Text("result: ", style="bold") + Text(json.dumps(data["result"])))
    if job.error:
        parts.append(Text(""))
        # A job that succeeded or waits for a retry keeps the error of an earlier attempt.
        label = "error:" if job.state == JobState.FAILED else "error of an earlier attempt:"
        parts.append(Text(label, style="bold red"))
        parts.append(Text(job.error.rstrip()))
    timeline = Table(title="Events", title_justify="left")
    for column in ("seq", "at", "kind", "attempt", "worker", "error"):
        timeline.add_column(column)
    for event in events:
        timeline.add_row(
            str(event.seq),
            event.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
            event.kind,
            str(event.attempt),
            event.worker or "",
            first_line(event.error),
        )
    parts.extend([Text(""), timeline])
    return Group(*parts)
