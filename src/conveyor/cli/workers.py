"""``conveyor workers``: the registered workers, and what an operator asks of one (quiet,
resume, stop, concurrency), carried by the store to whichever machine runs it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
from rich.text import Text

from conveyor.app import App
from conveyor.audit import record_cli
from conveyor.cli.options import dsn_option, json_option, open_app
from conveyor.cli.output import Col, console, fitted_table, print_json, relative, worker_dict
from conveyor.fleet import WorkerStatus
from conveyor.job import utcnow
from conveyor.store.worker_control import MAX_CONCURRENCY

WORKER_ID = click.argument("worker_id")


@click.group()
def workers() -> None:
    """The registered workers; quiet, resume, stop or resize one, on any machine."""


def _worker_command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """A ``conveyor workers`` command on one worker: WORKER_ID first, then any
    arguments of its own, and --dsn."""

    def command(fn: Callable[..., None]) -> click.Command:
        return workers.command(name)(WORKER_ID(dsn_option(fn)))

    return command


@workers.command("list")
@dsn_option
@json_option
def list_workers(dsn: str | None, as_json: bool) -> None:
    """Each worker with its queues, slots, jobs in hand and what it was asked."""
    with open_app(dsn) as app:
        found = app.workers()
    if as_json:
        print_json([worker_dict(status) for status in found])
        return
    if not found:
        click.echo("no workers registered")
        return
    columns = [Col("worker", ratio=2), Col("queues", ratio=1), Col("jobs", justify="right"),
               Col("state"), Col("last seen", justify="right")]  # fmt: skip
    now = utcnow()
    rows: list[list[str | Text]] = [_row(status, now) for status in found]
    console().print(fitted_table(columns, rows))


@_worker_command("show")
def show_worker(worker_id: str, dsn: str | None) -> None:
    """One worker as JSON: where it runs, its slots, the jobs it holds, what it was asked."""
    with open_app(dsn) as app:
        print_json(worker_dict(_one(app, worker_id)))


def _row(status: WorkerStatus, now: datetime) -> list[str | Text]:
    info = status.info
    jobs = f"{len(status.jobs)}/{status.concurrency}"
    return [info.id, ",".join(info.queues), jobs, _state(status), relative(info.last_seen_at, now)]


def _one(app: App, worker_id: str) -> WorkerStatus:
    for status in app.workers():
        if status.info.id == worker_id:
            return status
    raise click.ClickException(f"no worker {worker_id!r} is registered (see conveyor workers list)")


def _state(status: WorkerStatus) -> str:
    if status.info.control.get("stop"):
        return "stopping"
    if status.probably_dead:
        return "probably dead"
    return "quiet" if status.quiet else "working"


def _ask(worker_id: str, dsn: str | None, what: str, **asked: Any) -> None:
    with open_app(dsn) as app:
        app.control_worker(worker_id, **asked)
        record_cli(app, f"worker {what}", worker_id)
    click.echo(f"worker {worker_id}: {what} asked; it obeys at its next check-in")


@_worker_command("quiet")
def quiet_worker(worker_id: str, dsn: str | None) -> None:
    """Claim nothing new; finish what it holds (undo with resume)."""
    _ask(worker_id, dsn, "quiet", quiet=True)


@_worker_command("resume")
def resume_worker(worker_id: str, dsn: str | None) -> None:
    """Claim again after a quiet."""
    _ask(worker_id, dsn, "resume", quiet=False)


@_worker_command("stop")
def stop_worker(worker_id: str, dsn: str | None) -> None:
    """Stop gracefully: claim nothing new, let running jobs finish (up to its stop timeout)."""
    _ask(worker_id, dsn, "stop", stop=True)


@_worker_command("concurrency")
@click.argument("slots", type=click.IntRange(1, MAX_CONCURRENCY))
def worker_concurrency(worker_id: str, slots: int, dsn: str | None) -> None:
    """Run SLOTS jobs at once from now on (jobs already running finish first)."""
    _ask(worker_id, dsn, f"concurrency {slots}", concurrency=slots)
