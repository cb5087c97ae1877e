"""Options shared by the commands: the database, durations, JSON arguments."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from conveyor.app import App
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
    help="The database: sqlite:///path.db or postgresql://user@host:port/db.",
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


def parse_duration(text: str) -> timedelta:
    """``7d``, ``24h``, ``30m``, ``90s``, ``1h30m`` or a bare number of seconds."""
    cleaned = text.strip().lower()
    try:
        return timedelta(seconds=float(cleaned))
    except ValueError:
        pass
    parts = _PART.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValueError(f"{text!r} is not a duration: use e.g. 7d, 24h, 30m, 90s or 1h30m")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


class Duration(_ParamType):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, timedelta):
            return value
        try:
            duration = parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if duration < timedelta(0):
            self.fail(f"{value!r} is negative", param, ctx)
        return duration


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
)


def selection_options(f: F) -> F:
    """--state, --queue, --task, --group, --batch, --error and --worker."""
    for option in reversed(_SELECTION_OPTIONS):
        f = option(f)
    return f


def given(filters: dict[str, Any]) -> dict[str, str]:
    """The filters the user gave (click passes the others as None)."""
    return {name: value for name, value in filters.items() if value is not None}


class JobId(click.types.IntParamType):
    """A job id: a positive 64-bit integer (anything else cannot name a job)."""

    name = "job_id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not 0 < number < 2**63:
            self.fail(f"{value!r} is not a job id (a positive 64-bit integer)", param, ctx)
        return number
