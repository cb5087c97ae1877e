"""``conveyor audit``: operators' actions on this store, newest first (see conveyor.audit)."""

from __future__ import annotations

import click
from rich.text import Text

from conveyor import audit as audit_log
from conveyor.cli.options import dsn_option, json_option, open_app
from conveyor.cli.output import Col, console, fitted_table, print_json, short_when


@click.command("audit")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--before",
    type=click.IntRange(1, 2**63 - 1),
    default=None,
    help="Only entries older than this id.",
)
@dsn_option
@json_option
def audit(limit: int, before: int | None, dsn: str | None, as_json: bool) -> None:
    """Who retried, cancelled, purged, paused or limited what, when, and how many jobs.

    Every dashboard and every conveyor command on this store records its actions
    here (the CLI as $CONVEYOR_ACTOR, else user@host).
    """
    with open_app(dsn) as app:
        found = audit_log.entries(app, limit, before)
    if as_json:
        print_json([entry.as_dict() for entry in found])
        return
    if not found:
        click.echo("no actions recorded" + (f" before {before}" if before else ""))
        return
    rows: list[list[str | Text]] = [
        [
            str(e.id),
            short_when(e.at),
            e.actor,
            e.source,
            e.action,
            e.target,
            "—" if e.jobs is None else f"{e.jobs:,}",
        ]
        for e in found
    ]
    columns = [
        Col("id", justify="right"),
        Col("when (UTC)"),
        Col("who", ratio=2, min_width=8),
        Col("from"),
        Col("action", ratio=1, min_width=6),
        Col("on", ratio=3, min_width=10),
        Col("jobs", justify="right"),
    ]
    console().print(fitted_table(columns, rows))
    if len(found) == limit:
        click.echo(f"older: conveyor audit --before {found[-1].id}", err=True)
