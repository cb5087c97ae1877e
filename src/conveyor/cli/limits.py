"""Flow control on the command line: ``conveyor limit`` and ``conveyor limits``.

Also the limits block of ``conveyor stats`` (``limits_view``, ``limits_dict``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import click
from rich.console import RenderableType
from rich.text import Text

from conveyor.audit import record_cli
from conveyor.cli.options import Bounded, Duration, _ParamType, dsn_option, json_option, open_app
from conveyor.cli.output import (
    Col,
    console,
    fits,
    fitted_table,
    print_json,
    relative,
    stacked,
)
from conveyor.errors import ConfigurationError
from conveyor.job import utcnow
from conveyor.limits import (
    Limit,
    QueueLimits,
    check_concurrency,
    fullness_words,
    parse_rate,
    throttle_seconds,
)
from conveyor.store.records import LimitStatus


class RateValue(_ParamType):
    """``10/s``, ``600/m``, ``1000/h``, ``5/10s``: read (and refused) as ``app.limit`` does."""

    name = "rate"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            parse_rate(value)
        except ConfigurationError as exc:
            self.fail(str(exc), param, ctx)
        return value


@click.command()
@click.argument("queue")
@click.option(
    "--rate",
    type=RateValue(),
    default=None,
    help="At most N started in any window: 10/s, 600/m, 1000/h, 5/10s.",
)
@click.option(
    "--concurrency",
    type=Bounded(click.INT, check_concurrency),
    default=None,
    help="At most N running at once.",
)
@click.option("--no-rate", is_flag=True, help="Drop the rate (the concurrency stays).")
@click.option("--no-concurrency", is_flag=True, help="Drop the concurrency (the rate stays).")
@click.option("--per-key", is_flag=True, help="Set the limit of each limit key, not the queue's.")
@click.option("--clear", is_flag=True, help="Remove the limit (the queue's, or with --per-key).")
@click.option(
    "--throttle",
    type=Duration(lambda seconds: throttle_seconds(seconds, allow_zero=True)),
    default=None,
    help="Hold the queue (or --key) back for this long: 30s, 5m (a week at most); 0 lifts it.",
)
@click.option("--key", "limit_key", default=None, help="With --throttle: only this limit key.")
@dsn_option
@json_option
def limit(
    queue: str,
    rate: str | None,
    concurrency: int | None,
    no_rate: bool,
    no_concurrency: bool,
    per_key: bool,
    clear: bool,
    throttle: timedelta | None,
    limit_key: str | None,
    dsn: str | None,
    as_json: bool,
) -> None:
    """Show or set the rate and concurrency limits of QUEUE, obeyed by every worker.

    Set: --rate 10/s, --concurrency 3, or both; a call changes only what it
    names (--rate leaves the concurrency as it was). --no-rate or
    --no-concurrency drops one part, --clear both. --per-key sets the limit of
    each limit key instead (jobs enqueued with --limit-key). Without options:
    show the queue's limits and how full they are. Workers obey a change from
    their next claim, without a restart.
    """
    if rate is not None and no_rate:
        raise click.UsageError("give --rate to set the rate, or --no-rate to drop it, not both")
    if concurrency is not None and no_concurrency:
        raise click.UsageError(
            "give --concurrency to set it, or --no-concurrency to drop it, not both"
        )
    # Only the parts named change: app.limit keeps what it is not given.
    parts: dict[str, Any] = {}
    if rate is not None or no_rate:
        parts["rate"] = rate
    if concurrency is not None or no_concurrency:
        parts["concurrency"] = concurrency
    setting = bool(parts)
    if clear and setting:
        raise click.UsageError(
            "--clear drops the whole limit: give it, or --rate, --concurrency, --no-rate, "
            "--no-concurrency, not both"
        )
    if limit_key is not None and throttle is None:
        raise click.UsageError("--key names the limit key to --throttle")
    if throttle is not None and (setting or clear or per_key):
        raise click.UsageError("--throttle goes alone (with --key): set limits in another call")
    with open_app(dsn) as app:
        if throttle is not None:
            until = app.throttle(queue, throttle, limit_key=limit_key)
            what = f"queue {queue}" if limit_key is None else f"key {limit_key} of queue {queue}"
            lifted = throttle.total_seconds() == 0
            record_cli(app, "throttle lift" if lifted else f"throttle {throttle}", what)
            if throttle.total_seconds() == 0:
                click.echo(f"throttle of {what} lifted")
            else:
                click.echo(f"{what} throttled until {until:%Y-%m-%d %H:%M:%S} UTC")
        elif setting or clear:
            limits = app.limit(queue, **parts, clear=clear, per_key=per_key)
            scope = "each key of " if per_key else ""
            shown = _shown(_scope(limits, per_key))
            record_cli(
                app, "limit clear" if clear else "limit set", f"{scope}queue {queue}: {shown}"
            )
            if as_json:
                print_json(_config_dict(limits, queue))
                return
            click.echo(f"{scope}queue {queue}: {_shown(_scope(limits, per_key))}")
            return
        status = app.limits().get(queue)
        if as_json:
            print_json(status_dict(status) if status else _config_dict(None, queue))
        elif status is None:
            click.echo(f"queue {queue} has no limit")
        else:
            console().print(limits_table([status], utcnow()))


@click.command()
@dsn_option
@json_option
def limits(dsn: str | None, as_json: bool) -> None:
    """Every queue's limits, how full they are, and the ready jobs they hold back."""
    with open_app(dsn) as app:
        found = app.limits()
        if as_json:
            print_json({queue: status_dict(s) for queue, s in found.items()})
        elif not found:
            click.echo("no queue has a limit (set one with: conveyor limit QUEUE --rate 10/s)")
        else:
            console().print(limits_table(list(found.values()), utcnow()))


def _scope(limits: QueueLimits | None, per_key: bool) -> Limit | None:
    if limits is None:
        return None
    return limits.key_limit if per_key else limits.limit


def _shown(limit: Limit | None, each: str = "") -> str:
    """``20/s, 3 at once``; ``none``."""
    return "none" if limit is None else f"{limit}{each}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _limit_dict(limit: Limit | None) -> dict[str, Any] | None:
    if limit is None:
        return None
    return {
        "rate": str(limit.rate) if limit.rate is not None else None,
        "rate_count": limit.rate.count if limit.rate is not None else None,
        "rate_seconds": limit.rate.per if limit.rate is not None else None,
        "concurrency": limit.concurrency,
    }


def _config_dict(limits: QueueLimits | None, queue: str) -> dict[str, Any]:
    return {
        "queue": queue,
        "limit": _limit_dict(limits.limit if limits else None),
        "key_limit": _limit_dict(limits.key_limit if limits else None),
        "throttled_until": _iso(limits.throttled_until if limits else None),
    }


def status_dict(status: LimitStatus) -> dict[str, Any]:
    return {
        "queue": status.queue,
        "limit": _limit_dict(status.limit),
        "key_limit": _limit_dict(status.key_limit),
        "throttled_until": _iso(status.throttled_until),
        "running": status.running,
        "started_in_window": status.started,
        "room": status.room,
        "ready": status.ready,
        "held_back": status.held_back,
        "keys_full": status.keys_full,
        "keys_throttled": status.keys_throttled,
    }


def limits_dict(statuses: dict[str, LimitStatus]) -> dict[str, Any]:
    """The limits block of ``conveyor stats --json``."""
    return {queue: status_dict(s) for queue, s in statuses.items()}


def _fullness(status: LimitStatus) -> str:
    """How full the queue's own limit is: ``2 running; limit 3, 18 started in the last
    second; limit 20``."""
    return ", ".join(fullness_words(status.limit, status.running, status.started)) or "-"


def limits_table(statuses: list[LimitStatus], now: datetime) -> RenderableType:
    """A table when every row fits on one line; else a block per queue, wrapped, nothing cut."""
    headers = ("queue", "limit", "how full", "per key", "keys full", "throttled", "held back")
    columns = [
        Col(h, ratio=1 if h == "queue" else 0,
            justify="right" if h in ("keys full", "held back") else "left")
        for h in headers
    ]  # fmt: skip
    rows: list[list[str | Text]] = []
    for s in statuses:
        rows.append([
            s.queue,
            _shown(s.limit),
            _fullness(s),
            _shown(s.key_limit, " each") if s.key_limit else "-",
            f"{s.keys_full:,}" if s.key_limit or s.keys_throttled else "-",
            _throttled(s, now) or "-",
            Text(
                f"{s.held_back:,} of {s.ready:,} ready", style="dark_orange" if s.held_back else ""
            ),
        ])  # fmt: skip
    if fits(columns, rows):
        return fitted_table(columns, rows, title="Limits")
    blocks: list[Text] = [Text("Limits", style="italic")]
    for s in statuses:
        blocks.append(Text(s.queue, style="bold"))
        lines = [f"limit {_shown(s.limit)}: {_fullness(s)}"]
        if s.key_limit is not None or s.keys_throttled:
            lines.append(
                f"per key {_shown(s.key_limit, ' each') if s.key_limit else 'none'}: "
                f"{s.keys_full:,} key(s) full"
            )
        throttled = _throttled(s, now)
        held = f"held back {s.held_back:,} of {s.ready:,} ready"
        lines.append(f"throttled {throttled}; {held}" if throttled else held)
        blocks.extend(Text("  " + line) for line in lines)
    return stacked(blocks)


def _throttled(s: LimitStatus, now: datetime) -> str:
    """``in 59m12s (2 keys)``: the queue's throttle and how many keys are throttled."""
    throttled = relative(s.throttled_until, now) if s.throttled_until else ""
    if s.keys_throttled:
        keys = "key" if s.keys_throttled == 1 else "keys"
        throttled = f"{throttled} ({s.keys_throttled} {keys})".strip()
    return throttled


def limits_view(statuses: dict[str, LimitStatus]) -> RenderableType | None:
    """The limits block of ``conveyor stats`` (None when no queue has a limit)."""
    if not statuses:
        return None
    return limits_table(list(statuses.values()), utcnow())
