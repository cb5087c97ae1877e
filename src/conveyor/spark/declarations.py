"""What a write learns from the application: each task's queue, priority, attempts and signature.

``.option("app", "myapp.tasks:app")`` names the App the way ``conveyor worker``
does. The module is imported once, when Spark plans the write (on the driver,
in Spark's Python planner process, with ``$CONVEYOR_DSN`` set to the write's
DSN so that an ``App()`` without a DSN opens the same store); the tasks' handlers
are never sent to the executors, only these plain declarations are.
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.store.dsn import DSN_ENV


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    kind: int  # inspect.Parameter kind, as an int (enums of inspect pickle fine; ints are plainer)
    has_default: bool


@dataclass(frozen=True, slots=True)
class TaskDeclaration:
    """A registered task as ``@app.task`` declared it; ``parameters`` leave out the Context."""

    name: str
    queue: str
    priority: int
    max_attempts: int
    parameters: tuple[Parameter, ...]

    def takes(self, name: str) -> bool:
        """Whether the handler accepts a keyword argument called ``name``."""
        for p in self.parameters:
            if p.kind == inspect.Parameter.VAR_KEYWORD:
                return True
            if p.name == name and p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                inspect.Parameter.KEYWORD_ONLY,
            ):
                return True
        return False

    def takes_any_keyword(self) -> bool:
        """Whether the handler has a ``**kwargs`` parameter."""
        return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in self.parameters)

    def refusal(self, positional: int, names: Sequence[str]) -> str | None:
        """Why a call with ``positional`` arguments and keyword ``names`` cannot run, or None."""
        return _refusal(self.parameters, positional, frozenset(names))

    def describe(self) -> str:
        return f"{self.name}({', '.join(p.name for p in self.parameters)})"


@lru_cache(maxsize=4096)
def _refusal(
    parameters: tuple[Parameter, ...], positional: int, names: frozenset[str]
) -> str | None:
    signature = inspect.Signature(
        [
            inspect.Parameter(
                p.name,
                inspect._ParameterKind(p.kind),
                default=None if p.has_default else inspect.Parameter.empty,
            )
            for p in parameters
        ]
    )
    try:
        signature.bind(*([None] * positional), **dict.fromkeys(names))
    except TypeError as exc:
        return str(exc)
    return None


def is_keyword_name(name: str) -> bool:
    """Whether ``name`` can be a Python keyword argument."""
    return name.isidentifier() and not keyword.iskeyword(name)


def load_declarations(target: str, dsn: str) -> dict[str, TaskDeclaration]:
    """Import ``module:attribute`` (an App) and describe its registered tasks."""
    from conveyor.app import App

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(
            f"option app must name an App as module:attribute, e.g. myapp.tasks:app; got {target!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        with _dsn_for_import(dsn):
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"option app: cannot import {module_name!r} where Spark plans the write ({exc}); "
            "install the application where the driver runs, or run from its folder"
        ) from None
    app: Any = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise ConfigurationError(
            f"option app: {target!r} is not a conveyor App (got {type(app).__name__})"
        )
    return {name: _declaration(task) for name, task in app.tasks.items()}


def _declaration(task: Any) -> TaskDeclaration:
    parameters = list(inspect.signature(task.fn).parameters.values())
    if task.takes_context:
        parameters = parameters[1:]
    return TaskDeclaration(
        name=task.name,
        queue=task.queue,
        priority=task.priority,
        max_attempts=task.max_attempts,
        parameters=tuple(
            Parameter(p.name, int(p.kind), p.default is not inspect.Parameter.empty)
            for p in parameters
        ),
    )


@contextmanager
def _dsn_for_import(dsn: str) -> Iterator[None]:
    """``$CONVEYOR_DSN`` set to the write's DSN while the module is imported, then restored."""
    before = os.environ.get(DSN_ENV)
    os.environ[DSN_ENV] = dsn
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DSN_ENV, None)
        else:
            os.environ[DSN_ENV] = before
