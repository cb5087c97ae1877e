"""Looking after queues: ``conveyor stats``, ``pause``, ``resume`` and ``purge``."""

from __future__ import annotations

import time
from datetime import timedelta

import click
from rich.live import Live

from conveyor.cli.options import Duration, dsn_option, json_option, open_app
from conveyor.cli.output import console, interactive, print_json, progress, stats_dict, stats_view


@click.command()
@click.option("--watch", is_flag=True, help="Refresh until interrupted.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True)
@click.option("--times", type=click.IntRange(min=1), default=None, hidden=True)
@dsn_option
@json_option
def stats(watch: bool, interval: float, times: int | None, dsn: str | None, as_json: bool) -> None:
    """Jobs per queue and state, oldest ready age, throughput and live workers."""
    with open_app(dsn) as app:
        if not watch:
            times = 1
        shown = 0
        if watch and interactive() and not as_json:
            # Redrawn in place on a terminal; a pipe gets one snapshot per interval.
            with Live(console=console(), auto_refresh=False) as live:
                while times is None or shown < times:
                    live.update(stats_view(app.stats(), app.store.worker_list()), refresh=True)
                    shown += 1
                    if times is None or shown < times:
                        time.sleep(interval)
            return
        while times is None or shown < times:
            snapshot, workers = app.stats(), app.store.worker_list()
            if as_json:
                print_json(stats_dict(snapshot, workers))
            else:
                console().print(stats_view(snapshot, workers))
            shown += 1
            if times is None or shown < times:
                time.sleep(interval)


@click.command()
@click.option(
    "--older-than",
    type=Duration(),
    required=True,
    help="Finished more than this long ago: 7d, 24h, 30m, 90s.",
)
@dsn_option
def purge(older_than: timedelta, dsn: str | None) -> None:
    """Delete finished jobs (and their events) older than --older-than."""
    with open_app(dsn) as app:
        stats = app.stats()
        finished = sum(stats.count(state) for state in ("succeeded", "failed", "cancelled"))
        # The total is an upper bound (not all finished jobs are old enough): the bar may end early.
        with progress("purging", finished) as advance:
            deleted = app.purge(older_than, on_batch=advance)
    click.echo(f"purged {deleted:,} finished job(s) older than {older_than}")


@click.command()
@click.argument("queue")
@dsn_option
def pause(queue: str, dsn: str | None) -> None:
    """Stop workers claiming from QUEUE (running jobs finish)."""
    with open_app(dsn) as app:
        app.pause(queue)
    click.echo(f"queue {queue} paused")


@click.command()
@click.argument("queue")
@dsn_option
def resume(queue: str, dsn: str | None) -> None:
    """Let workers claim from QUEUE again."""
    with open_app(dsn) as app:
        app.resume(queue)
    click.echo(f"queue {queue} resumed")
