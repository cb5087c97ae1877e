"""The ``conveyor`` command (installed with ``conveyor[cli]``).

Every command takes ``--dsn`` (default ``$CONVEYOR_DSN``, else ``./conveyor.db``),
before or after the command's name. Listings print tables, or JSON with
``--json``. Errors are one line on stderr and a non-zero exit; ``--debug``
(anywhere on the line) shows the traceback instead.
"""

from __future__ import annotations

import os

import click

from conveyor.cli.audit import audit
from conveyor.cli.encryption import encryption
from conveyor.cli.export import export
from conveyor.cli.group import ConveyorGroup, LazyCommand
from conveyor.cli.jobs import enqueue, jobs
from conveyor.cli.limits import limit, limits
from conveyor.cli.queues import delete_queue, pause, purge, queues, resume, stats, trim
from conveyor.cli.signals import signal_job, wake_job
from conveyor.cli.tasks import tasks
from conveyor.cli.worker import HANDLER_THREAD_PREFIX, load_app, migrate, worker
from conveyor.cli.workers import workers
from conveyor.cli.workflows import workflows
from conveyor.errors import ConfigurationError
from conveyor.store.dsn import DSN_ENV
from conveyor.store.sql import load_migrations
from conveyor.version import __version__

__all__ = ["HANDLER_THREAD_PREFIX", "cli", "load_app"]

_SPARK = ("pyspark", "pyarrow", "pandas", "py4j")

#: Commands whose code lives in optional extras, imported only when run.
LAZY_COMMANDS = {
    "dashboard": LazyCommand(
        "conveyor.web.commands:dashboard",
        extra="web",
        requires=("starlette", "jinja2", "uvicorn"),
        short_help="Serve the web dashboard (and /metrics).",
    ),
    "metrics": LazyCommand(
        "conveyor.web.exporter:metrics",
        extra="web",
        requires=("starlette", "uvicorn"),
        short_help="Serve /metrics alone, for Prometheus.",
    ),
    "report": LazyCommand(
        "conveyor.spark.commands:report",
        extra="spark",
        requires=_SPARK,
        short_help="Queue analytics with Spark: throughput, latencies, failures.",
    ),
    "archive": LazyCommand(
        "conveyor.spark.commands:archive",
        extra="spark",
        requires=_SPARK,
        short_help="Archive finished jobs to Parquet with Spark, then purge them.",
    ),
    "spark": LazyCommand(
        "conveyor.spark.write_commands:spark",
        extra="spark",
        requires=("pyspark", "pyarrow"),
        short_help="Spark's writes into the store: list them, clean up after dead drivers.",
    ),
    "demo": LazyCommand(
        "conveyor.cli.demo:demo",
        extra="cli",
        requires=("rich", "click"),
        short_help="Run a mixed workload on two workers, kill one, watch it recover.",
    ),
}


@click.group(cls=ConveyorGroup, lazy=LAZY_COMMANDS)
@click.version_option(__version__, "--version", "-V", prog_name="conveyor")
@click.option("--debug", is_flag=True, help="Show tracebacks (also after the command).")
@click.option(
    "--dsn",
    default=None,
    help="The database, for any command (also after the command, where it wins).",
)
def cli(debug: bool, dsn: str | None) -> None:
    """conveyor: a durable job queue on SQLite, PostgreSQL or Redis."""
    if dsn is not None:
        if not dsn.strip():
            raise ConfigurationError("the DSN given with --dsn is empty")
        # Every command reads its --dsn from $CONVEYOR_DSN when not given after it.
        os.environ[DSN_ENV] = dsn


#: The schema version this code's migrations reach on the SQL stores, and Redis's key layout
#: (conveyor.store.redis.store.LAYOUT_VERSION, not imported here: redis-py is optional).
SCHEMA_VERSION = len(load_migrations("conveyor.store.sqlite"))
REDIS_LAYOUT = 3
cli.help = (
    "conveyor: a durable job queue on SQLite, PostgreSQL or Redis.\n\n"
    "The store is named by --dsn (default $CONVEYOR_DSN, else ./conveyor.db): "
    "sqlite:///path.db (SQLite), postgresql://user@host:5432/db (PostgreSQL) or "
    f"redis://host:6379/0 (Redis). Schema version {SCHEMA_VERSION} (Redis: key layout "
    f"{REDIS_LAYOUT}): `conveyor migrate` brings a store to it."
)

for _command in (migrate, worker, enqueue, jobs, stats, purge, trim, pause, resume, delete_queue):
    cli.add_command(_command)
for _command in (limit, limits, workflows, tasks, audit, encryption, export, workers, queues):
    cli.add_command(_command)
jobs.add_command(signal_job)
jobs.add_command(wake_job)
