"""Errors translated at the store's boundary, so callers never match a driver's text.

A database without conveyor's tables (never migrated, or dropped by hand)
answers each statement with its own error: SQLite's "no such table", psycopg's
``UndefinedTable``. A database that cannot take a write for now (a full disk,
a file locked past the busy timeout) answers with another: SQLite's
"database or disk is full", PostgreSQL's SQLSTATE class 53. Callers (the API,
the CLI, the dashboard, the worker) must not match driver text, so every public
method of a SQL store is wrapped once, here: the first becomes
``SchemaMissingError``, which says what to do; the second
``StoreUnavailableError``, which every caller already treats as an outage (the
worker keeps an outcome and writes it again later, instead of taking the error
for the database refusing that outcome and failing the job).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from conveyor.errors import SchemaMissingError, StoreUnavailableError

T = TypeVar("T", bound=type)

#: Whether an error says the schema is missing.
IsMissing = Callable[[BaseException], bool]
#: Why an error says the database cannot take the call for now (it is away), or None.
AwayReason = Callable[[BaseException], "str | None"]


def translate_errors(is_missing: IsMissing, away: AwayReason) -> Callable[[T], T]:
    """A class decorator over the public methods of a store, its own and inherited.

    ``is_missing(exc)`` errors become SchemaMissingError; errors ``away(exc)``
    gives a reason for become StoreUnavailableError naming the database and
    that reason.
    """

    def decorate(cls: T) -> T:
        # Every public method, the capability mixins' a store class inherits included.
        for name in dir(cls):
            member = inspect.getattr_static(cls, name)
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            if inspect.isgeneratorfunction(member) or inspect.iscoroutinefunction(member):
                continue
            setattr(cls, name, _translating(member, is_missing, away))
        return cls

    return decorate


def _translating(method: Callable[..., Any], is_missing: IsMissing, away: AwayReason) -> Any:
    @functools.wraps(method)
    def translated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            where = getattr(self, "description", "the database")
            if is_missing(exc):
                raise SchemaMissingError(
                    f"{where} lacks conveyor's tables ({str(exc).strip().splitlines()[0]}): "
                    "run `conveyor migrate` (or app.migrate()) first"
                ) from exc
            reason = away(exc)
            if reason is None:
                raise
            raise StoreUnavailableError(f"{where} {reason}") from exc

    return translated
