"""The ``conveyor`` command (installed with ``conveyor[cli]``)."""

from __future__ import annotations

import sys
from typing import Any

import click

from conveyor.app import App
from conveyor.errors import ConveyorError
from conveyor.store.dsn import DSN_ENV, default_dsn

dsn_option = click.option(
    "--dsn",
    envvar=DSN_ENV,
    default=None,
    show_default=f"${DSN_ENV}, else sqlite:///conveyor.db",
    help="The database: sqlite:///path.db or postgresql://user@host:port/db.",
)


class ConveyorGroup(click.Group):
    """Prints conveyor's errors as one clear line (with --debug: the traceback too)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConveyorError as exc:
            if ctx.params.get("debug"):
                raise
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(1)


@click.group(cls=ConveyorGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def cli(debug: bool) -> None:
    """conveyor: a durable job queue on SQLite and PostgreSQL."""


@cli.command()
@dsn_option
def migrate(dsn: str | None) -> None:
    """Create or upgrade the database schema."""
    with App(dsn or default_dsn()) as app:
        version = app.migrate()
        click.echo(f"{app.store.description}: schema at version {version}")
