"""The ``conveyor report`` and ``conveyor archive`` commands (Spark pipelines).

Standalone click commands: the ``conveyor`` group attaches them with a lazy
import, so ``conveyor --help`` does not start (or need) Spark.

Spark runs in local mode on all cores unless ``--master`` (or ``$SPARK_MASTER``)
names a cluster; under ``spark-submit`` or in a notebook the session already
running is used.
"""

from __future__ import annotations

import re
from datetime import UTC, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import click

from conveyor.bulk import check_age
from conveyor.cli.output import console as cli_console
from conveyor.errors import ConveyorError
from conveyor.store.dsn import DSN_ENV, default_dsn, open_store, sqlite_path

if TYPE_CHECKING:
    from pyspark.sql import Row, SparkSession
    from rich.console import Console

    from conveyor.spark.analytics import Report

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """ "30m", "24h", "7d", "2w", "90s", or parts together ("1h30m"), as a timedelta."""
    compact = text.strip().lower().replace(" ", "")
    parts = _PART.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"{text!r} is not a duration: write a number and a unit (s, m, h, d or w), "
            "e.g. 30m, 24h, 7d or 1h30m"
        )
    # Bounded as a purge's age is (checked on the number: a huge one is no timedelta).
    return check_age(sum(float(n) * _UNITS[u] for n, u in parts))


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> timedelta:
    """A click callback: the option's text as a timedelta, or a usage error saying why not."""
    try:
        return parse_duration(value)
    except (ValueError, ConveyorError) as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


dsn_option = click.option(
    "--dsn",
    envvar=DSN_ENV,
    default=None,
    show_default=f"${DSN_ENV}, else sqlite:///conveyor.db",
    help="The database: sqlite:///path.db or postgresql://user@host:port/db.",
)
master_option = click.option(
    "--master",
    envvar="SPARK_MASTER",
    default="local[*]",
    show_default=True,
    help="Spark master URL (ignored when a Spark session is already running).",
)


def _spark(master: str, app_name: str) -> SparkSession:
    try:
        from pyspark.sql import SparkSession

        from conveyor.spark import register, session
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    spark = session(master, app_name, conf={"spark.ui.showConsoleProgress": "false"})
    # Spark's own INFO and WARN lines would bury the tables.
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _checked_dsn(dsn: str | None) -> str:
    """The DSN to use, once its database is known to hold conveyor's tables.

    Checked before Spark starts: a wrong path or a down server is then a
    one-line error in a second, not a Python worker's traceback after ten.
    """
    dsn = dsn or default_dsn()
    try:
        if dsn.lower().startswith("sqlite:") and not sqlite_path(dsn).is_file():
            raise click.ClickException(f"no database at {sqlite_path(dsn)} (DSN {dsn})")
        store = open_store(dsn, migrate=False)
        try:
            version = store.schema_version()
        finally:
            store.close()
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    if version == 0:
        raise click.ClickException(
            f"{store.description} has no conveyor tables: run `conveyor migrate` first"
        )
    return dsn


@click.command("report")
@click.option(
    "--since", callback=_duration, default="24h", show_default=True, help="How far back to look."
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Also write Parquet tables and PNG charts to this folder.",
)
@dsn_option
@master_option
def report(since: timedelta, out: Path | None, dsn: str | None, master: str) -> None:
    """Queue analytics: throughput, wait and run times, outcomes and top errors."""
    from rich.markup import escape

    from conveyor.spark.analytics import report as build

    dsn = _checked_dsn(dsn)
    console = cli_console()
    spark = _spark(master, "conveyor report")
    with console.status("Reading jobs and events..."):
        result = build(spark, dsn, since=since)
        summary = result.summary.collect()
        errors = result.errors.collect()
    _print_report(console, result, summary, errors)
    if out is not None:
        with console.status(f"Writing to {out}..."):
            written = result.write(out)
        names = escape(", ".join(p.name for p in written))
        console.print(f"Wrote {names} to [bold]{escape(str(out))}[/]")


def _print_report(console: Console, result: Report, summary: list[Row], errors: list[Row]) -> None:
    from rich.table import Table
    from rich.text import Text

    from conveyor.spark.analytics import format_seconds

    window = f"{result.start:%Y-%m-%d %H:%M} to {result.end:%Y-%m-%d %H:%M} UTC"
    if not summary:
        console.print(f"No job activity from {window}.")
        return

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    # Two tables rather than one of thirteen columns: each fits a terminal.
    outcomes = Table(title=f"Outcomes, {window}", title_justify="left")
    rates = Table(
        title="Rates: success and failure of finished jobs, retry and rescue of attempts",
        title_justify="left",
    )
    for table in (outcomes, rates):
        for name in ("Queue", "Task"):
            table.add_column(name, style="bold")
    for name in ("Jobs/min", "Peak/min", "Succeeded", "Failed", "Cancelled", "Retried"):
        outcomes.add_column(name, justify="right")
    outcomes.add_column("Rescued", justify="right")
    for name in ("Success", "Failure", "Retry", "Rescue"):
        rates.add_column(name, justify="right")
    for r in summary:
        outcomes.add_row(
            # Names and errors as Text: rich would read a str as markup ("a[/]b" raises).
            Text(r["queue"]),
            Text(r["task"]),
            # Significant digits: a quiet queue over a long window is still not 0.00.
            f"{r['throughput_per_minute']:.3g}",
            str(r["peak_per_minute"]),
            str(r["succeeded"]),
            f"[red]{r['failed']}[/]" if r["failed"] else "0",
            str(r["cancelled"]),
            str(r["retried"]),
            f"[yellow]{r['rescued']}[/]" if r["rescued"] else "0",
        )
        rates.add_row(
            Text(r["queue"]),
            Text(r["task"]),
            pct(r["success_rate"]),
            pct(r["failure_rate"]),
            pct(r["retry_rate"]),
            pct(r["rescue_rate"]),
        )
    console.print(outcomes)
    console.print(rates)

    latency = Table(title="Wait (created to started) and run (started to finished) times")
    latency.title_justify = "left"
    for name in ("Queue", "Task"):
        latency.add_column(name, style="bold")
    for kind in ("Wait", "Run"):
        for name in ("p50", "p95", "p99"):
            latency.add_column(f"{kind} {name}", justify="right")
    for r in summary:
        latency.add_row(
            Text(r["queue"]),
            Text(r["task"]),
            *[
                format_seconds(r[f"{k}_{p}"])
                for k in ("wait", "run")
                for p in ("p50", "p95", "p99")
            ],
        )
    console.print(latency)

    if errors:
        top = Table(title="Most frequent errors", title_justify="left")
        top.add_column("Count", justify="right")
        top.add_column("Jobs", justify="right")
        top.add_column("Queue / task", style="bold")
        top.add_column("Error", overflow="fold")
        top.add_column("Last seen (UTC)")
        for e in errors:
            top.add_row(
                str(e["count"]),
                str(e["jobs"]),
                Text(f"{e['queue']} / {e['task']}"),
                Text(e["error"]),
                # collect() gives naive local times; astimezone reads them as such.
                f"{e['last_seen'].astimezone(UTC):%Y-%m-%d %H:%M:%S}",
            )
        console.print(top)


@click.command("archive")
@click.option(
    "--older-than",
    callback=_duration,
    default="7d",
    show_default=True,
    help="Archive terminal jobs that finished longer ago than this.",
)
@click.option(
    "--to",
    "to",
    required=True,
    help="Where the Parquet archive lives (a folder, or a URL Spark can write to).",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Write the archive and delete nothing from the store (a copy).",
)
@dsn_option
@master_option
def archive(older_than: timedelta, to: str, dsn: str | None, master: str, keep: bool) -> None:
    """Move finished jobs and their events to Parquet, then delete them from the store.

    Only what the archive holds is deleted; a run that stopped half-way is
    finished by running the command again. With --keep nothing is deleted.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

    from conveyor.spark.archiving import archive as run_archive

    dsn = _checked_dsn(dsn)
    console = cli_console()
    spark = _spark(master, "conveyor archive")
    if console.is_terminal:
        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        )
        step = progress.add_task("Selecting finished jobs", total=None)

        def show(stage: str, done: int, total: int) -> None:
            if stage == "selected":
                progress.update(step, description=f"Writing {total} jobs to Parquet", total=None)
            elif stage == "written":
                progress.update(step, description="Deleting archived jobs", total=None)
            else:
                progress.update(step, completed=done, total=total)

        with progress:
            result = run_archive(spark, dsn, older_than, to, progress=show, keep=keep)
    else:

        def log(stage: str, done: int, total: int) -> None:
            if stage == "selected":
                console.print(f"{total} finished jobs older than the cutoff")
            elif stage == "written":
                console.print(f"{done} written to {to} by this run")

        result = run_archive(spark, dsn, older_than, to, progress=log, keep=keep)
    earlier = result.selected - result.written
    note = f" ({earlier} were already in the archive)" if earlier else ""
    console.print(
        f"Archived {result.written} jobs finished before {result.cutoff:%Y-%m-%d %H:%M} UTC "
        f"to {to}{note}; "
        + (
            "kept them in the store (--keep)."
            if keep
            else f"deleted {result.deleted} from the store."
        ),
        highlight=False,
    )
