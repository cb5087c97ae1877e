"""Errors translated at the store's boundary: a missing schema is SchemaMissingError everywhere.

A database without conveyor's tables (never migrated, or dropped by hand)
answers each statement with its own error: SQLite's "no such table", psycopg's
``UndefinedTable``. Callers (the API, the CLI, the dashboard, the worker) must
not match driver text, so every public method of a SQL store is wrapped once,
here, and turns such an error into ``SchemaMissingError``, which says what to do.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from conveyor.errors import SchemaMissingError

T = TypeVar("T", bound=type)


def translate_missing_schema(is_missing: Callable[[BaseException], bool]) -> Callable[[T], T]:
    """A class decorator: ``is_missing(exc)`` errors of public methods become SchemaMissingError."""

    def decorate(cls: T) -> T:
        for name, member in list(vars(cls).items()):
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            if inspect.isgeneratorfunction(member) or inspect.iscoroutinefunction(member):
                continue
            setattr(cls, name, _translating(member, is_missing))
        return cls

    return decorate


def _translating(method: Callable[..., Any], is_missing: Callable[[BaseException], bool]) -> Any:
    @functools.wraps(method)
    def translated(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not is_missing(exc):
                raise
            where = getattr(self, "description", "the database")
            raise SchemaMissingError(
                f"{where} lacks conveyor's tables ({str(exc).strip().splitlines()[0]}): "
                "run `conveyor migrate` (or app.migrate()) first"
            ) from exc

    return translated
