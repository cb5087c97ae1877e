"""``conveyor jobs signal``: send a job the signal its handler waits for (ctx.wait_for)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.text import Text

from conveyor.app import App
from conveyor.audit import record_cli
from conveyor.cli.options import JobId, _ParamType, dsn_option, open_app
from conveyor.errors import JobNotFoundError
from conveyor.job import Job
from conveyor.signals import spawned, wake


class _Json(_ParamType):
    """Any JSON document."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"{value!r} is not valid JSON: {exc.msg} at character {exc.pos}", param, ctx)


@click.command("signal")
@click.argument("job_id", type=JobId())
@click.argument("name")
@click.option(
    "--payload", type=_Json(), default="null", show_default=True, help="The payload, as JSON."
)
@dsn_option
def signal_job(job_id: int, name: str, payload: Any, dsn: str | None) -> None:
    """Send signal NAME to a job (its handler waits with ctx.wait_for).

    A job parked waiting for it is due at once; a live job that does not wait
    yet keeps it for its wait. A finished or unknown job is refused.
    """
    with open_app(dsn) as app:
        woken = app.signal(job_id, name, payload)
        record_cli(app, "signal", f"job {job_id}: {name}", 1)
    said = "it was waiting for it: due now" if woken else "kept until it waits for it"
    click.echo(f"signal {name!r} sent to job {job_id} ({said})")


def waiting_of(app: App, job_id: int) -> dict[str, Any] | None:
    """What a parked job waits for (a signal or children, until when), as JSON; None when
    no wait parked it (or the store keeps no waits)."""
    port = app.durable
    waits = None if port is None else port.job_waiting(job_id)
    if waits is None:
        return None
    sleeps = waits.signal is None and waits.children is None
    return {
        "kind": "sleep" if sleeps else "signal" if waits.signal is not None else "children",
        "step": waits.step,
        "signal": waits.signal,
        "children": waits.children,
        "until": waits.until.isoformat(),
    }


def waiting_view(waits: dict[str, Any]) -> Text:
    """``waiting: for signal 'paid' (step ...), until 2026-...`` (or for children 4, 5;
    or sleeps)."""
    if waits["kind"] == "sleep":
        what = "sleeps"
    elif waits["kind"] == "signal":
        what = f"for signal {waits['signal']!r}"
    else:
        what = "for children " + ", ".join(str(i) for i in waits["children"] or [])
    return Text("waiting: ", style="bold") + Text(
        f"{what} (step {waits['step']}), until {waits['until']}"
    )


@click.command("wake")
@click.argument("job_id", type=JobId())
@dsn_option
def wake_job(job_id: int, dsn: str | None) -> None:
    """Wake a parked job now (ctx.sleep, ctx.wait_for, ctx.wait).

    Its wait ends: a sleep is over, a wait for a signal times out, a wait for
    children looks again; the job is due now. A job no wait parks is refused.
    """
    with open_app(dsn) as app:
        wake(app.durable, job_id, app.get)
        record_cli(app, "wake", f"job {job_id}", 1)
    click.echo(f"job {job_id} woken: due now")


#: What a spawned child's edge resolved in, as the workflow views draw it.
SPAWNED = "spawned"


def with_spawned(
    app: App, jobs: list[Job], edges: list[tuple[int, int, str | None]]
) -> tuple[list[Job], list[tuple[int, int, str | None]]]:
    """A workflow's jobs and edges (child, parent, resolved) with the children its jobs
    spawned (``ctx.spawn``), and theirs, each drawn after its parent by an edge resolved
    as ``spawned``: read off each job's steps, for the workflow views only."""
    if not app.capabilities().steps:
        return jobs, edges
    known = {job.id for job in jobs}
    more_jobs, more_edges = list(jobs), list(edges)
    for job in more_jobs:  # the children drawn, in turn: their own children too
        for child_id in spawned(app.steps(job.id)):
            if child_id in known:
                continue
            try:
                child = app.get(child_id)
            except JobNotFoundError:
                continue  # deleted since: nothing to draw
            known.add(child_id)
            more_jobs.append(child)
            more_edges.append((child_id, job.id, SPAWNED))
    return more_jobs, more_edges
