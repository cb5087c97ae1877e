"""Running the queue: ``conveyor migrate`` and ``conveyor worker MODULE:APP``."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
from typing import Any

import click

from conveyor.app import App
from conveyor.cli.logs import FORMATS, LEVELS, configure_logging
from conveyor.cli.options import bounded_option, dsn_option, open_app
from conveyor.errors import ConfigurationError
from conveyor.store.dsn import DSN_ENV

#: The most jobs (and prefetched ones) a worker process holds at once.
MAX_WORKER_CONCURRENCY = 10_000
#: A day, in seconds: the longest lease or drain the command takes.
DAY = 86_400.0


@click.command()
@dsn_option
def migrate(dsn: str | None) -> None:
    """Create or upgrade the store's schema (SQLite, PostgreSQL; Redis: its key layout)."""
    with open_app(dsn, must_exist=False, migrating=True) as app:
        version = app.migrate()
        click.echo(f"{app.description}: schema at version {version}")


def load_app(target: str) -> App:
    """Import ``module.path:attribute`` (the App object), the way gunicorn finds its app."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"{target!r}: expected module:attribute, e.g. myapp.tasks:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from None
    if not hasattr(module, attribute):
        raise click.BadParameter(f"{target!r}: module {module_name!r} has no {attribute!r}")
    app = getattr(module, attribute)
    if not isinstance(app, App):
        raise click.BadParameter(f"{target!r} is not a conveyor App (got {type(app).__name__})")
    return app


@click.command()
@click.argument("app_path", metavar="MODULE:APP")
@dsn_option
@click.option("--queues", default=None, help="Comma-separated queues (default: all the app's).")
@bounded_option(
    "--concurrency", click.INT, 1, MAX_WORKER_CONCURRENCY, default=8, help_text="Jobs run at once."
)
@bounded_option(
    "--prefetch",
    click.INT,
    0,
    MAX_WORKER_CONCURRENCY,
    default=0,
    help_text="Jobs claimed beyond the free slots, held until a slot frees (see docs/workers.md).",
)
@click.option("--burst", is_flag=True, help="Return when no job is ready or running.")
@bounded_option(
    "--stop-timeout",
    click.FLOAT,
    0,
    DAY,
    unit=" seconds",
    default=30.0,
    help_text="Seconds to drain.",
)
@bounded_option(
    "--lease",
    click.FLOAT,
    0.1,
    DAY,
    unit=" seconds",
    low_open=True,
    default=30.0,
    help_text="Lease length in seconds.",
)
@bounded_option(
    "--poll-interval",
    click.FLOAT,
    0,
    3600,
    unit=" seconds",
    low_open=True,
    default=1.0,
    help_text="Fallback poll, seconds.",
)
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    default="INFO",
    show_default=True,
    help="INFO shows a line per finished job; WARNING only trouble.",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="text for people, json for log collectors (one object per line).",
)
def worker(
    app_path: str,
    dsn: str | None,
    queues: str | None,
    log_level: str,
    log_format: str,
    **running: Any,
) -> None:
    """Run a worker for the App at MODULE:APP until SIGTERM or SIGINT.

    The App's module is imported after --dsn is put in $CONVEYOR_DSN, so an
    ``App()`` created without a DSN works on the database named here.
    """
    if dsn is not None:
        if not dsn.strip():
            raise ConfigurationError("the DSN given with --dsn is empty")
        os.environ[DSN_ENV] = dsn
    # Through the logging module, before the App's module is imported: that module
    # may route conveyor's loggers its own way (dictConfig, basicConfig(force=True)).
    configure_logging(log_level, log_format)
    app = load_app(app_path)
    app.check_schema()  # "run conveyor migrate" rather than a traceback from the worker
    chosen = [q.strip() for q in queues.split(",") if q.strip()] if queues else None
    # The other options (--concurrency, --prefetch, --burst, --stop-timeout, --lease,
    # --poll-interval) are named after run_worker's parameters, and go as given.
    code = app.run_worker(queues=chosen, **running)
    if _handlers_still_running():
        # Their jobs were released when the drain ended (a sync handler cannot be
        # interrupted). Waiting for their threads would keep the process, and the
        # handlers' side effects, alive while another worker runs the same jobs.
        logging.getLogger("conveyor.worker").warning(
            "exiting with handlers still running; their jobs were released"
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


#: Name prefix of the worker's handler threads (its ThreadPoolExecutor).
HANDLER_THREAD_PREFIX = "conveyor-handler"


def _handlers_still_running(grace: float = 0.5) -> bool:
    """Whether a handler thread outlives the worker (idle pool threads end within ``grace``)."""
    deadline = time.monotonic() + grace
    threads = [t for t in threading.enumerate() if t.name.startswith(HANDLER_THREAD_PREFIX)]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return any(t.is_alive() for t in threads)
