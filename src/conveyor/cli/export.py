"""``conveyor export``: jobs with their history, out of the store, deleting nothing."""

from __future__ import annotations

import sys
from typing import Any

import click

from conveyor.cli.options import dsn_option, given, open_app, selection_options
from conveyor.errors import ConfigurationError
from conveyor.export import (
    FORMATS,
    csv_lines,
    exported_jobs,
    jsonl_lines,
    write_lines,
    write_parquet,
)


@click.command()
@selection_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="jsonl", show_default=True)
@click.option(
    "--output", "-o", default="-", show_default=True, help="The file to write ('-': stdout)."
)
@click.option(
    "--limit", type=click.IntRange(1, 2**63 - 1), default=None, help="At most this many jobs."
)
@click.option("--events/--no-events", default=True, help="Each job's history with it.")
@dsn_option
def export(
    fmt: str,
    output: str,
    limit: int | None,
    events: bool,
    dsn: str | None,
    **filters: Any,
) -> None:
    """Write the jobs a selection names, newest first, with their events (JSON lines,
    CSV or Parquet), without deleting them."""
    if fmt == "parquet" and output == "-":
        raise ConfigurationError("a Parquet export needs a file: --output jobs.parquet")
    with open_app(dsn) as app:
        records = exported_jobs(app, given(filters), limit, events)
        if fmt == "parquet":
            count = write_parquet(records, output)
        else:
            lines = csv_lines(records) if fmt == "csv" else jsonl_lines(records)
            if output == "-":
                count = write_lines(lines, sys.stdout)
            else:
                with open(output, "w", encoding="utf-8", newline="") as out:
                    count = write_lines(lines, out)
    click.echo(f"exported {count:,} job(s)" + ("" if output == "-" else f" to {output}"),
               err=True)  # fmt: skip
