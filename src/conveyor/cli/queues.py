"""Looking after queues: ``conveyor stats``, ``pause``, ``resume``, ``delete-queue``, ``purge``,
``trim``; ``conveyor queues show`` and ``conveyor queues fair`` (fair turns)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import click
from rich.live import Live

from conveyor.app import App
from conveyor.audit import record_cli
from conveyor.bulk import check_age
from conveyor.cli.options import Duration, F, bounded_option, dsn_option, json_option, open_app
from conveyor.cli.output import console, interactive, print_json, progress, stats_dict, stats_view
from conveyor.errors import ConveyorError
from conveyor.fair import MAX_WEIGHT, check_weight, fair_dict
from conveyor.job import validate_name
from conveyor.logs import spelled_duration
from conveyor.store.expiring import expired_counts
from conveyor.worker.retention import MAX_KEEP

FINAL_STATES = ("succeeded", "failed", "cancelled")


def _final_states(help_text: str) -> Callable[[F], F]:
    """--state, repeatable: the final states whose jobs a deleting command takes."""
    return click.option(
        "--state", "states", type=click.Choice(FINAL_STATES), multiple=True, help=help_text
    )


@click.command()
@click.option("--watch", is_flag=True, help="Refresh until interrupted (Ctrl-C).")
@bounded_option(
    "--interval",
    click.FLOAT,
    0.1,
    3600,
    unit=" seconds",
    default=2.0,
    help_text="Seconds between two refreshes of --watch (0.1 to 3600).",
)
@click.option("--times", type=click.IntRange(1, 1_000_000), default=None, hidden=True)
@dsn_option
@json_option
def stats(watch: bool, interval: float, times: int | None, dsn: str | None, as_json: bool) -> None:
    """Jobs per queue and state, oldest ready age, throughput and workers."""
    with open_app(dsn) as app:
        if not watch:
            times = 1
        try:
            _show_stats(app, watch, interval, times, as_json)
        except KeyboardInterrupt:
            # Ctrl-C is how a watch ends: not an error, and nothing to add.
            return


def _show_stats(app: App, watch: bool, interval: float, times: int | None, as_json: bool) -> None:
    shown = 0
    if watch and interactive() and not as_json:
        # Redrawn in place on a terminal; a pipe gets one snapshot per interval.
        with Live(console=console(), auto_refresh=False) as live:
            while times is None or shown < times:
                expired = expired_counts(app.expiry)
                live.update(stats_view(app.stats(), app.workers(), expired), refresh=True)
                shown += 1
                if times is None or shown < times:
                    time.sleep(interval)
        return
    while times is None or shown < times:
        snapshot, workers, expired = app.stats(), app.workers(), expired_counts(app.expiry)
        if as_json:
            print_json(stats_dict(snapshot, workers, expired))
        else:
            console().print(stats_view(snapshot, workers, expired))
        shown += 1
        if times is None or shown < times:
            time.sleep(interval)


@click.command()
@click.option(
    "--older-than",
    type=Duration(check_age),
    required=True,
    help="Finished more than this long ago: 7d, 24h, 30m, 90s (0s: all of them).",
)
@_final_states("Only jobs that ended so (repeat for several; default: all three).")
@click.option("--queue", default=None, help="Only jobs of this queue.")
@click.option("--dry-run", is_flag=True, help="Count the jobs it would delete; delete none.")
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@dsn_option
def purge(
    older_than: timedelta,
    states: tuple[str, ...],
    queue: str | None,
    dry_run: bool,
    yes: bool,
    dsn: str | None,
) -> None:
    """Delete finished jobs (and their events) older than --older-than.

    Counts them first and asks before deleting (--yes does not ask).
    """
    chosen = list(states) or None
    # "older than 0:00:00" says nothing: --older-than 0s means every finished job.
    age = older_than.total_seconds()
    aged = f" older than {spelled_duration(age)}" if age > 0 else " of any age"
    what = f"{'/'.join(states or FINAL_STATES)} job(s){aged}"
    if queue is not None:
        what += f" in queue {queue}"
    with open_app(dsn) as app:
        count = app.purge_count(older_than, states=chosen, queue=queue)
        if dry_run:
            click.echo(f"would purge {count:,} {what}")
            return
        if count == 0:
            click.echo(f"purged 0 {what}")
            return
        if not yes:
            _confirm(f"purge {count:,} {what}?")
        with progress("purging", count) as advance:
            deleted = app.purge(older_than, states=chosen, queue=queue, on_batch=advance)
        record_cli(app, "purge", f"finished {what}", deleted)
    click.echo(f"purged {deleted:,} {what}")


@click.command()
@click.argument("queue")
@click.option(
    "--keep",
    type=click.IntRange(0, MAX_KEEP),
    required=True,
    help="How many of the newest finished jobs to keep (0: none).",
)
@_final_states(
    "Only jobs that ended so, counted together (repeat for several; default: all three)."
)
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@dsn_option
def trim(queue: str, keep: int, states: tuple[str, ...], yes: bool, dsn: str | None) -> None:
    """Delete QUEUE's finished jobs beyond its --keep newest (and their events), now.

    What retention by count does on its own schedule, on demand: `conveyor trim
    mail --keep 100 --state failed` keeps the 100 newest failed jobs of mail.
    """
    what = f"{'/'.join(states or FINAL_STATES)} job(s)"
    with open_app(dsn) as app:
        _warn_if_unknown(app, queue)
        if not yes:
            _confirm(f"delete the {what} of queue {queue} beyond its {keep:,} newest?")
        deleted = app.trim(queue, keep=keep, states=list(states) or None)
        record_cli(app, "trim", f"queue {queue}: {what} beyond the {keep:,} newest", deleted)
    click.echo(f"trimmed {deleted:,} {what} of queue {queue} (kept the {keep:,} newest)")


def _confirm(question: str) -> None:
    try:
        click.confirm(question, abort=True, err=True)
    except click.Abort:
        raise ConveyorError("not confirmed: nothing changed (--yes acts without asking)") from None


def _warn_if_unknown(app: App, queue: str) -> None:
    """A queue nobody has used is most likely a typo: say so (the command still acts)."""
    validate_name("queue", queue)
    known = app.queue_names()
    if queue not in known:
        click.secho(
            f"warning: no queue named {queue!r} has jobs or settings yet "
            f"(known: {', '.join(known) or 'none'})",
            fg="yellow",
            err=True,
        )


@click.command()
@click.argument("queue")
@dsn_option
def pause(queue: str, dsn: str | None) -> None:
    """Stop workers claiming from QUEUE (running jobs finish)."""
    _pause_or_resume(queue, dsn, pausing=True)


@click.command()
@click.argument("queue")
@dsn_option
def resume(queue: str, dsn: str | None) -> None:
    """Let workers claim from QUEUE again."""
    _pause_or_resume(queue, dsn, pausing=False)


def _pause_or_resume(queue: str, dsn: str | None, *, pausing: bool) -> None:
    with open_app(dsn) as app:
        _warn_if_unknown(app, queue)
        if pausing:
            app.pause(queue)
        else:
            app.resume(queue)
        record_cli(app, "pause" if pausing else "resume", f"queue {queue}")
    click.echo(f"queue {queue} {'paused' if pausing else 'resumed'}")


@click.command("delete-queue")
@click.argument("queue")
@click.option("--yes", "-y", is_flag=True, help="Delete without asking.")
@dsn_option
def delete_queue(queue: str, yes: bool, dsn: str | None) -> None:
    """Delete QUEUE: its queued and finished jobs, their history, and its pause.

    Refused while jobs of the queue are running (cancel them, or wait).
    """
    with open_app(dsn) as app:
        if queue not in app.queue_names():
            raise ConveyorError(f"no queue named {queue!r}: nothing to delete")
        counts = app.count_jobs(None, queue=queue)
        total = sum(counts.values())
        found = ", ".join(f"{state} {n:,}" for state, n in counts.items()) or "no jobs"
        click.echo(f"queue {queue} holds {total:,} job(s) ({found})")
        if not yes:
            _confirm(f"delete queue {queue} and its {total:,} job(s)?")
        deleted = app.delete_queue(queue)
        record_cli(app, "delete queue", f"queue {queue}", deleted)
    click.echo(f"queue {queue} deleted with {deleted:,} job(s)")


# --- conveyor queues: show a queue, make it fair ------------------------------------


@click.group()
def queues() -> None:
    """Look at a queue (show), or make its claims take turns across its keys (fair)."""


def _weight_pair(text: str) -> tuple[str, float]:
    key, sep, number = text.rpartition("=")
    if not sep or not key:
        raise click.BadParameter(
            f"{text!r}: give KEY=WEIGHT, such as gold=3", param_hint="--weight"
        )
    try:
        return key, check_weight(f"the weight of key {key!r}", float(number))
    except (ValueError, ConveyorError) as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint="--weight") from exc


@queues.command("fair")
@click.argument("queue")
@click.option(
    "--weight",
    "weights",
    multiple=True,
    metavar="KEY=WEIGHT",
    help="A key's weight (repeatable): gold=3 takes three turns to a key of weight 1.",
)
@click.option("--default-weight", type=click.FloatRange(0, MAX_WEIGHT, min_open=True),
              default=1.0, show_default=True, help="The weight of a key not named.")  # fmt: skip
@click.option("--off", is_flag=True, help="Claim QUEUE in priority order again (no turns).")
@dsn_option
def fair(
    queue: str, weights: tuple[str, ...], default_weight: float, off: bool, dsn: str | None
) -> None:
    """Make QUEUE fair: its claims take ready jobs from its keys (limit_key) in turn."""
    pairs = dict(_weight_pair(text) for text in weights)
    if off and (pairs or default_weight != 1.0):
        raise ConveyorError("--off takes no weights")
    with open_app(dsn) as app:
        _warn_if_unknown(app, queue)
        app.fair(queue, pairs, default_weight=default_weight, enabled=not off)
        shown = ", ".join(f"{k}={w:g}" for k, w in pairs.items())
        record_cli(
            app, "fair off" if off else "fair", f"queue {queue}" + (f" ({shown})" if shown else "")
        )
    if off:
        click.echo(f"queue {queue} claims in priority order (not fair)")
    else:
        click.echo(
            f"queue {queue} is fair by fair_key (by default limit_key): "
            f"default weight {default_weight:g}" + (f"; {shown}" if shown else "")
        )


@queues.command("show")
@click.argument("queue")
@dsn_option
@json_option
def show(queue: str, dsn: str | None, as_json: bool) -> None:
    """What QUEUE holds, whether it is paused, and whether it is fair (with its busiest keys)."""
    validate_name("queue", queue)
    with open_app(dsn) as app:
        counts = app.count_jobs(None, queue=queue)
        stats = app.stats().queues.get(queue)
        turns = app.fair_queues(queue).get(queue)
    paused = bool(stats and stats.paused)
    if as_json:
        fairness = None if turns is None else fair_dict(turns)
        print_json({"queue": queue, "paused": paused, "counts": counts, "fair": fairness})
        return
    click.echo(f"queue {queue}" + (" (paused)" if paused else ""))
    click.echo("  jobs: " + (", ".join(f"{s} {n:,}" for s, n in counts.items()) or "none"))
    if turns is None:
        click.echo("  fair: no (claims in priority order, oldest first)")
        return
    named = ", ".join(f"{k}={w:g}" for k, w in sorted(turns.weights.items()))
    click.echo(
        f"  fair: by fair_key (by default limit_key), default weight {turns.default_weight:g}"
        + (f", weights {named}" if named else "")
    )
    if turns.aging is not None:
        rule = turns.aging
        every = f"{rule.every:g}s" if isinstance(rule.every, float) else str(rule.every)
        click.echo(f"  aging: +{rule.step} priority every {every} waited, +{rule.cap} at most")
    if turns.keys:
        click.echo(f"  {'key':<24} {'weight':>7} {'queued':>9} {'recent share':>13} {'starts':>9}")
    for key in turns.keys:
        click.echo(
            f"  {key.key if key.key is not None else '(no key)':<24} {turns.weight(key.key):>7g} "
            f"{key.queued:>9,} {turns.share(key):>12.0%} {key.starts:>9,}"
        )
