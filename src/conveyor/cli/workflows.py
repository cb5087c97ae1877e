"""``conveyor workflows``: list declared workflows, show one (its jobs and edges), cancel
one, retry one from its failures."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Group
from rich.text import Text

from conveyor.audit import record_cli
from conveyor.cli.options import dsn_option, json_option, open_app
from conveyor.cli.output import (
    STATE_STYLE,
    Col,
    console,
    counts_view,
    first_line,
    fitted_table,
    print_json,
    short_when,
)
from conveyor.cli.signals import with_spawned
from conveyor.export import job_dict
from conveyor.job import utcnow


@click.group()
def workflows() -> None:
    """Declared workflows: list them, show one with its jobs, cancel or retry one."""


@workflows.command("list")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@dsn_option
@json_option
def list_workflows(limit: int, dsn: str | None, as_json: bool) -> None:
    """Workflows, newest first, with their jobs counted by state."""
    with open_app(dsn) as app:
        found = app.workflows(limit=limit)
        counts = {w.id: app.workflow_status(w.id).counts for w in found}
    if as_json:
        print_json(
            [
                {
                    "id": w.id,
                    "name": w.name,
                    "jobs": w.jobs,
                    "created_at": w.created_at.isoformat(),
                    "counts": counts[w.id],
                }
                for w in found
            ]
        )
        return
    if not found:
        click.echo("no workflows")
        return
    rows: list[list[str | Text]] = [
        [w.id, w.name, f"{w.jobs:,}", short_when(w.created_at), _counts_text(counts[w.id])]
        for w in found
    ]
    columns = [
        Col("id", ratio=2, min_width=8),
        Col("name", ratio=1, min_width=6),
        Col("jobs", justify="right"),
        Col("created (UTC)"),
        Col("states", ratio=3, min_width=12),
    ]
    console().print(fitted_table(columns, rows))


@workflows.command("show")
@click.argument("workflow_id")
@dsn_option
@json_option
def show_workflow(workflow_id: str, dsn: str | None, as_json: bool) -> None:
    """A workflow: its jobs in order, what each waits for, and its counts."""
    with open_app(dsn) as app:
        run = app.workflow(workflow_id)
        status = app.workflow_status(workflow_id)
        jobs, edges = with_spawned(app, run.jobs, app.workflow_edges(workflow_id))
    parents: dict[int, list[int]] = {}
    for child, parent, _ in edges:
        parents.setdefault(child, []).append(parent)
    if as_json:
        print_json(
            {
                "id": run.id,
                "name": run.name,
                "counts": status.counts,
                "failed_job": status.failed_job.id if status.failed_job else None,
                "jobs": [{**job_dict(job), "after": parents.get(job.id, [])} for job in jobs],
            }
        )
        return
    now = utcnow()
    rows: list[list[str | Text]] = []
    for job in jobs:
        state = job.detailed_state(now)
        rows.append(
            [
                str(job.id),
                job.task,
                Text(state, style=STATE_STYLE[state]),
                ", ".join(str(p) for p in parents.get(job.id, [])) or "-",
                first_line(job.error, 200),
            ]
        )
    table = fitted_table(
        [
            Col("id", justify="right"),
            Col("task", ratio=2, min_width=6),
            Col("state"),
            Col("after", ratio=1, min_width=5),
            Col("error", ratio=3, min_width=12, cut=True),
        ],
        rows,
    )
    head = Text(f"workflow {run.id}", style="bold")
    if run.name != run.id:
        head.append(f" ({run.name})", style="dim")
    parts: list[Any] = [head, counts_view(status.counts), table]
    if status.failed_job is not None:
        parts.append(Text(f"first failed job: {status.failed_job.id}", style="red"))
    console().print(Group(*parts))


@workflows.command("cancel")
@click.argument("workflow_id")
@dsn_option
def cancel_workflow(workflow_id: str, dsn: str | None) -> None:
    """Cancel every job of a workflow that has not ended (running ones: asked to stop)."""
    with open_app(dsn) as app:
        app.workflow(workflow_id)  # a clear error for an unknown id
        changed = app.cancel_workflow(workflow_id)
        record_cli(app, "cancel workflow", f"workflow {workflow_id}", changed)
    click.echo(f"{changed:,} jobs of workflow {workflow_id} cancelled or asked to stop")


@workflows.command("retry")
@click.argument("workflow_id")
@dsn_option
def retry_workflow(workflow_id: str, dsn: str | None) -> None:
    """Run a workflow again from its failures: its failed jobs and the jobs their failure
    cancelled go back as new; the jobs that succeeded keep their results."""
    with open_app(dsn) as app:
        changed = app.retry_workflow(workflow_id)
    if changed:
        click.echo(f"{changed:,} jobs of workflow {workflow_id} put back to run again")
    else:
        click.echo(f"workflow {workflow_id} has no failed job: nothing to run again")


def _counts_text(counts: dict[str, int]) -> Text:
    text = Text()
    for state, n in counts.items():
        if text:
            text.append("  ")
        text.append(f"{n:,} {state}", style=STATE_STYLE.get(state, ""))
    return text
