"""``conveyor spark writes`` and ``conveyor spark cleanup``: Spark's writes, seen and cleaned.

Plain database work (no Spark session starts); the ``conveyor`` group attaches
the ``spark`` group with a lazy import, as it does ``report`` and ``archive``.
"""

from __future__ import annotations

from datetime import timedelta

import click

from conveyor.cli.options import json_option
from conveyor.cli.output import console as cli_console
from conveyor.cli.output import print_json, short_when
from conveyor.errors import ConveyorError
from conveyor.spark.commands import _checked_dsn, _duration, dsn_option
from conveyor.spark.housekeeping import cleanup as run_cleanup
from conveyor.spark.housekeeping import writes as list_writes


@click.group("spark")
def spark() -> None:
    """Spark's writes into the store: list them, clean up after dead drivers."""


@spark.command("writes")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--abandoned-after",
    default="24h",
    show_default=True,
    callback=_duration,
    help="An open write older than this shows as abandoned.",
)
@dsn_option
@json_option
def writes(limit: int, abandoned_after: timedelta, dsn: str | None, as_json: bool) -> None:
    """List past and open Spark writes, newest first: id, when, rows, enqueued, skipped, state.

    A committed write shows when it committed; an open one (running, or
    abandoned by a driver that died) when it started.
    """
    checked = _checked_dsn(dsn)
    try:
        rows = list_writes(checked, limit, abandoned_after)
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        print_json(
            [
                {
                    "id": r.id,
                    "at": r.at.isoformat(),
                    "rows": r.rows,
                    "enqueued": r.enqueued,
                    "skipped": r.skipped,
                    "state": r.state,
                }
                for r in rows
            ]
        )
        return
    console = cli_console()
    if not rows:
        console.print("No Spark writes recorded in this store.")
        return
    from rich.table import Table

    table = Table(title="Spark writes, newest first", title_justify="left")
    for name in ("id", "when (UTC)", "rows", "enqueued", "skipped", "state"):
        table.add_column(
            name, justify="right" if name in ("rows", "enqueued", "skipped") else "left"
        )

    def count(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    for r in rows:
        table.add_row(
            r.id, short_when(r.at), count(r.rows), count(r.enqueued), count(r.skipped), r.state
        )
    console.print(table)


@spark.command("cleanup")
@click.option(
    "--abandoned-after",
    default="24h",
    show_default=True,
    callback=_duration,
    help="Clear writes open longer than this (their driver died): what they staged is dropped.",
)
@click.option(
    "--results-older-than",
    default="30d",
    show_default=True,
    callback=_duration,
    help="Purge the results of writes committed before this; their writeId may be reused.",
)
@click.option("--keep-results", is_flag=True, help="Purge no results.")
@dsn_option
def cleanup(
    abandoned_after: timedelta, results_older_than: timedelta, keep_results: bool, dsn: str | None
) -> None:
    """Clear abandoned Spark writes and their staging now, and purge old write results."""
    checked = _checked_dsn(dsn)
    try:
        done = run_cleanup(checked, abandoned_after, None if keep_results else results_older_than)
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    cleared = ", ".join(done.cleared) if done.cleared else "none"
    settled = (
        f"settled {len(done.settled)} writes left prepared by a committer that died "
        f"({', '.join(done.settled)}); "
        if done.settled
        else ""
    )
    click.echo(
        f"Cleared {len(done.cleared)} abandoned writes ({cleared}); {settled}"
        f"purged {done.purged} results."
    )
