"""Options shared by the commands: the database, durations, JSON arguments."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from conveyor.app import App
from conveyor.errors import ConveyorError
from conveyor.job import FILTER_STATES
from conveyor.store.dsn import DSN_ENV, default_dsn, require_existing

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    # ParamType is generic in the stubs of recent click only; at run time the
    # plain class keeps older click (>= 8.1) working.
    _ParamType = click.ParamType[Any]
else:
    _ParamType = click.ParamType

dsn_option: Callable[[F], F] = click.option(
    "--dsn",
    envvar=DSN_ENV,
    default=None,
    show_default=f"${DSN_ENV}, else sqlite:///conveyor.db",
    help="The store: sqlite:///path.db, postgresql://user@host:port/db or redis://host:port/0.",
)

json_option: Callable[[F], F] = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of a table."
)


@contextmanager
def open_app(dsn: str | None, *, must_exist: bool = True, migrating: bool = False) -> Iterator[App]:
    """An App on the database, for commands that need no task code (pool kept small).

    Commands that only read or operate keep ``must_exist``: a SQLite file that
    does not exist is refused (a typo must not become an empty database). Every
    command but ``migrate`` checks the schema first, so a database without
    conveyor's tables says "run conveyor migrate" instead of "no such table".
    """
    resolved = dsn if dsn is not None else default_dsn()
    if must_exist:
        require_existing(resolved)
    context = click.get_current_context(silent=True)
    if context is None or not context.find_root().params.get("debug"):
        # The pool logs every failed connection attempt as a multi-line warning; the
        # command's own error already says the server cannot be reached, in one line.
        logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    options: dict[str, Any] = {}
    if not resolved.startswith("sqlite:"):
        # A person is waiting: an unreachable server is reported after 5 s, not the
        # default 10. One command, one thread: a pool of one connection is enough.
        options = {"connect_timeout": 5.0}
        if resolved.startswith(("postgresql:", "postgres:")):
            options.update(min_size=1, max_size=2)
    with App(resolved, **options) as app:
        if not migrating:
            app.check_schema()
        yield app


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
#: The longest duration a timedelta holds; a bound per option comes on top.
_LONGEST = timedelta.max.total_seconds()


def duration_seconds(text: str) -> float:
    """``7d``, ``24h``, ``30m``, ``90s``, ``1h30m`` or a bare number, as finite seconds.

    Only a number is made here, never a timedelta, so a huge one can be refused
    with its option's own bound before anything is built from it.
    """
    cleaned = text.strip().lower()
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _PART.findall(cleaned)
        if not parts or "".join(n + u for n, u in parts) != cleaned:
            raise ValueError(
                f"{text!r} is not a duration: use e.g. 7d, 24h, 30m, 90s or 1h30m"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a duration: use e.g. 7d, 24h, 30m, 90s or 1h30m")
    return seconds


def parse_duration(text: str) -> timedelta:
    """``7d``, ``24h``, ``30m``, ``90s``, ``1h30m`` or a bare number of seconds."""
    seconds = duration_seconds(text)
    if abs(seconds) > _LONGEST:
        raise ValueError(f"{text!r} is too long a duration: at most 999,999,999 days")
    return timedelta(seconds=seconds)


#: A check of an option's value that raises with the API's own message when it is out of bounds.
Check = Callable[[Any], object]


class Duration(_ParamType):
    """A duration; ``check`` (given the seconds) bounds it with the API's own message."""

    name = "duration"

    def __init__(self, check: Check | None = None) -> None:
        self.check = check

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            seconds = duration_seconds(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if seconds < 0:
            self.fail(f"{value!r} is negative", param, ctx)
        if self.check is not None:
            try:
                self.check(seconds)
            except (ConveyorError, ValueError) as exc:
                self.fail(str(exc), param, ctx)
        if seconds > _LONGEST:
            self.fail(f"{value!r} is too long a duration: at most 999,999,999 days", param, ctx)
        return timedelta(seconds=seconds)


class Bounded(_ParamType):
    """A number read by ``kind`` (click.INT or click.FLOAT), finite, then passed to ``check``.

    ``check`` raises with the message the API itself gives for that value, so
    the command line and the API refuse a number in the same words, before
    anything is opened or allocated.
    """

    def __init__(self, kind: _ParamType, check: Check) -> None:
        self.kind = kind
        self.check = check
        self.name = kind.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = self.kind.convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        try:
            self.check(number)
        except (ConveyorError, ValueError) as exc:
            self.fail(str(exc), param, ctx)
        return number


def within(what: str, low: float, high: float, unit: str = "", *, low_open: bool = False) -> Check:
    """A check that ``low <= value <= high`` (``low < value`` with ``low_open``)."""

    def check(value: float) -> None:
        too_low = value <= low if low_open else value < low
        if too_low or value > high:
            span = (
                f"more than {_shown(low)} and at most {_shown(high)}"
                if low_open
                else f"from {_shown(low)} to {_shown(high)}"
            )
            raise ValueError(f"{what} must be {span}{unit}, got {value!r}")

    return check


def bounded_option(
    flag: str,
    kind: _ParamType,
    low: float,
    high: float,
    *,
    default: float,
    help_text: str,
    unit: str = "",
    low_open: bool = False,
) -> Callable[[F], F]:
    """The option ``flag``: a number read by ``kind``, refused in words that name the
    flag unless within ``low`` and ``high`` (see ``within``); its default is shown."""
    check = within(flag, low, high, unit, low_open=low_open)
    return click.option(
        flag, type=Bounded(kind, check), default=default, show_default=True, help=help_text
    )


def _shown(number: float) -> str:
    """``10,000``, ``0.1``: a bound as people write it."""
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


class JsonValue(_ParamType):
    """A JSON document of one kind (``list`` for args, ``dict`` for kwargs)."""

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.name = "json " + ("array" if kind is list else "object")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, self.kind):
            return value
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"{value!r} is not valid JSON: {exc.msg} at character {exc.pos}", param, ctx)
        if not isinstance(decoded, self.kind):
            self.fail(f"{value!r} is not a JSON {self.name.split()[1]}", param, ctx)
        return decoded


#: The filters of a selection, as command-line options (each command's ``**filters``).
_SELECTION_OPTIONS = (
    click.option(
        "--state",
        type=click.Choice(list(FILTER_STATES)),
        default=None,
        help="A state, or ready / scheduled / retrying (kinds of queued job).",
    ),
    click.option("--queue", default=None, help="Jobs of this queue."),
    click.option("--task", default=None, help="Jobs of this task."),
    click.option("--group", default=None, help="Jobs of this group (ordering key)."),
    click.option("--batch", default=None, help="Jobs of this batch."),
    click.option("--error", default=None, help="Jobs whose last error contains this text."),
    click.option("--worker", default=None, help="Jobs claimed by this worker id."),
    click.option("--key", default=None, help="The job holding this idempotency key."),
    click.option("--limit-key", default=None, help="Jobs a per-key limit counts under this key."),
    click.option(
        "--args",
        "args_text",
        default=None,
        help="Jobs whose arguments (as JSON) contain this text; the newest 100,000 jobs only.",
    ),
)


def selection_options(f: F) -> F:
    """--state, --queue, --task, --group, --batch, --error, --worker, --key, --limit-key, --args."""
    for option in reversed(_SELECTION_OPTIONS):
        f = option(f)
    return f


def given(filters: dict[str, Any]) -> dict[str, str]:
    """The filters the user gave (click passes the others as None), named as the API names them."""
    chosen = {name: value for name, value in filters.items() if value is not None}
    if "args_text" in chosen:
        chosen["args"] = chosen.pop("args_text")
    return chosen


class JobId(click.types.IntParamType):
    """A job id: a positive 64-bit integer (anything else cannot name a job)."""

    name = "job_id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not 0 < number < 2**63:
            self.fail(f"{value!r} is not a job id (a positive 64-bit integer)", param, ctx)
        return number
