"""Tasks: a handler function registered with an App, and the options of one enqueue."""

from __future__ import annotations

import asyncio
import inspect
import math
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from conveyor.arguments import ArgumentTypes, task_schema
from conveyor.context import Context
from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import AfterFailure, Job, Unique, utcnow, validate_name
from conveyor.retain import Retain, check_task_retain
from conveyor.retry import DEFAULT_BACKOFF, Backoff
from conveyor.unique import Unique as UniqueWindow
from conveyor.unique import resolve_unique

P = ParamSpec("P")
R = TypeVar("R")

_UNSET: Any = object()


class _ByLimitKey:
    def __repr__(self) -> str:
        return "BY_LIMIT_KEY"


#: ``fair_key=`` not given: the job takes turns by its limit_key.
BY_LIMIT_KEY: Any = _ByLimitKey()


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """How one enqueue differs from the task's defaults. Never read from the task's own kwargs."""

    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    key: str | None = None
    #: "live", "forever", or a window: Unique(period=..., states=[...]) (unique.py).
    unique: Unique | UniqueWindow = "live"
    group: str | None = None
    batch: str | None = None
    #: The key a per-key limit of the queue counts the job under (e.g. a customer id).
    limit_key: str | None = None
    #: The key a fair queue takes turns by (app.fair): by default the limit_key;
    #: None puts the job with the jobs of no key.
    fair_key: str | None = BY_LIMIT_KEY
    #: A DB-API connection with an open transaction: the job commits with the caller's rows.
    connection: Any = None
    #: Metadata stored with the job for the worker side (``job.headers``): strings by name.
    headers: dict[str, str] | None = None
    #: Jobs (or ids) this one waits for: it runs once every one of them succeeded.
    after: Sequence[Job | int] | None = None
    #: What a parent's failure or cancel does: "cancel" this job, or "run" it anyway.
    after_failure: AfterFailure = "cancel"
    #: The deadline to start by (seconds or a timedelta from now, or an aware
    #: datetime): a job not started by then never starts (see expiry.py).
    expires: float | timedelta | datetime | None = None
    #: How long the finished job is kept, overriding its queue's age rules (retain.py).
    retain: Retain | None = None
    #: With a key: "replace" updates the queued job holding it (replace.py).
    on_conflict: str = "answer"
    #: With a key: a burst of enqueues becomes one job, due this long after the last.
    debounce: float | timedelta | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One job to be in a workflow: a task, its arguments and options (``task.step``)."""

    task: Task[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: EnqueueOptions

    def __repr__(self) -> str:
        return f"<Step {self.task.name}>"


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def context_parameter(fn: Callable[..., Any]) -> bool:
    """Whether the handler's first parameter is conveyor's ``Context``.

    Judged by the annotation's resolved type, never by its name: a
    ``click.Context`` or a class of the user's own named ``Context`` is an
    ordinary argument. An annotation written as a string (``from __future__
    import annotations``) is resolved in the handler's module; one that cannot
    be resolved there is refused, since conveyor could only guess.
    """
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in _POSITIONAL:
        return False
    annotation = params[0].annotation
    if isinstance(annotation, str):
        try:
            annotation = typing.get_type_hints(fn).get(params[0].name, annotation)
        except Exception as exc:  # NameError, or anything the annotations' code raises
            if annotation.rsplit(".", 1)[-1] != "Context":
                return False
            raise ConfigurationError(
                f"cannot tell whether {getattr(fn, '__qualname__', fn)!r} takes conveyor's "
                f"Context: its annotation {annotation!r} does not resolve ({exc}); import "
                "Context at run time (from conveyor import Context), not under TYPE_CHECKING"
            ) from None
    return annotation is Context


def argument_problems(
    signature: inspect.Signature, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[str]:
    """What stops ``signature`` from taking these arguments, each problem named."""
    params = signature.parameters
    positional = [p for p in params.values() if p.kind in _POSITIONAL]
    kinds = {p.kind for p in params.values()}
    problems = []
    if len(args) > len(positional) and inspect.Parameter.VAR_POSITIONAL not in kinds:
        problems.append(f"{len(args) - len(positional)} positional argument(s) too many")
    by_position = {p.name for p in positional[: len(args)]}
    if inspect.Parameter.VAR_KEYWORD not in kinds:
        unexpected = [
            k for k in kwargs
            if k not in params or params[k].kind in (inspect.Parameter.POSITIONAL_ONLY, *_VARIADIC)
        ]  # fmt: skip
        if unexpected:
            problems.append(f"unexpected keyword argument(s) {', '.join(map(repr, unexpected))}")
    doubled = [k for k in kwargs if k in by_position]
    if doubled:
        problems.append(f"given both by position and by name: {', '.join(map(repr, doubled))}")
    missing = [
        p.name for p in params.values()
        if p.default is inspect.Parameter.empty and p.kind not in _VARIADIC
        and p.name not in by_position and p.name not in kwargs
    ]  # fmt: skip
    if missing:
        problems.append(f"missing argument(s) {', '.join(map(repr, missing))}")
    return problems


class TaskRegistry(Protocol):
    """What a Task needs of the App it is registered with (a protocol: no upward import)."""

    def enqueue_calls(
        self, task: str, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], opts: EnqueueOptions
    ) -> list[Job]: ...


class Task(Generic[P, R]):
    """A registered handler. Call it to run the function here; ``enqueue`` to run it on a worker."""

    def __init__(
        self,
        app: TaskRegistry,
        fn: Callable[P, R],
        *,
        name: str,
        queue: str,
        max_attempts: int,
        priority: int,
        timeout: float | None,
        backoff: Backoff | None,
        expires: float | timedelta | datetime | None = None,
        retain: Retain | None = None,
        fair_key: str | None = BY_LIMIT_KEY,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_attempts = max_attempts
        self.priority = priority
        self.timeout = timeout
        self.backoff: Backoff = backoff or DEFAULT_BACKOFF
        #: The default deadline of its jobs (``expires=`` of an enqueue overrides it).
        self.expires = expires
        #: The default retention of its finished jobs (``retain=`` of an enqueue overrides it).
        self.retain = check_task_retain(name, retain)
        #: The default fair key of its jobs (``fair_key=`` of an enqueue overrides it).
        self.fair_key = check_task_fair_key(name, fair_key)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_context = context_parameter(fn)
        self._signature = inspect.signature(fn)
        #: The handler's parameters of rich types (models, dataclasses, enums, dates...),
        #: carried through the job's JSON; None when it has none (and pays nothing).
        self.arguments = ArgumentTypes.of(fn, skip_first=self.takes_context)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def check_arguments(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        """Refuse at enqueue time a call the handler could never accept."""
        mismatch = self.binding_error(args, kwargs)
        if mismatch is not None:
            raise InvalidJobError(mismatch)

    def binding_error(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
        """Why the handler cannot be called with these arguments, or None when it can.

        Names every missing, unexpected or doubled argument and the handler's
        signature (without its Context parameter).
        """
        bind_args = [None, *args] if self.takes_context else list(args)
        try:
            self._signature.bind(*bind_args, **kwargs)
        except TypeError as exc:
            problems = argument_problems(self._signature, bind_args, kwargs) or [str(exc)]
            params = list(self._signature.parameters.values())[int(self.takes_context) :]
            shown = inspect.Signature(
                [p.replace(annotation=inspect.Parameter.empty) for p in params]
            )
            return (
                f"arguments do not fit task {self.name!r}: {'; '.join(problems)}; "
                f"it takes {self.name}{shown}"
            )
        return None

    def schema(self) -> dict[str, Any]:
        """A JSON Schema of the handler's arguments, by parameter name (``app.task_schema``)."""
        return task_schema(self.fn, self.takes_context, self.name)

    def options(self, **options: Any) -> BoundTask[P, R]:
        """Enqueue options for the next call: ``task.options(key="k", delay=10).enqueue(...)``."""
        return BoundTask(self, _make_options(EnqueueOptions(), options))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job that calls the handler with these arguments; return it (see ``options``)."""
        return BoundTask(self, EnqueueOptions()).enqueue(*args, **kwargs)

    def step(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """This call as a step of a workflow (not enqueued): see ``conveyor.Workflow``."""
        return BoundTask(self, EnqueueOptions()).step(*args, **kwargs)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code: does not block the event loop."""
        return await BoundTask(self, EnqueueOptions()).aenqueue(*args, **kwargs)

    def enqueue_many(self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]) -> list[Job]:
        """Enqueue many ``(args, kwargs)`` calls in one transaction: all of them, or none."""
        return BoundTask(self, EnqueueOptions()).enqueue_many(calls)


class BoundTask(Generic[P, R]):
    """A task with options chosen for the next enqueue."""

    def __init__(self, task: Task[P, R], options: EnqueueOptions) -> None:
        self.task = task
        self.opts = options

    def options(self, **options: Any) -> BoundTask[P, R]:
        """More options for the same enqueue (the later ones win)."""
        return BoundTask(self.task, _make_options(self.opts, options))

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Store a job with these options and arguments; return it."""
        return self.enqueue_many([(args, kwargs)])[0]

    def step(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """This call with these options, as a step of a workflow (not enqueued)."""
        self.task.check_arguments(args, kwargs)
        return Step(self.task, tuple(args), dict(kwargs), self.opts)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """``enqueue`` for async code: does not block the event loop."""
        jobs = await asyncio.to_thread(self.enqueue_many, [(args, kwargs)])
        return jobs[0]

    def enqueue_many(self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]) -> list[Job]:
        """Enqueue many calls in one transaction: all of them, or none when one is invalid."""
        calls = list(calls)
        for args, kwargs in calls:
            self.task.check_arguments(args, kwargs)
        return self.task.app.enqueue_calls(self.task.name, calls, self.opts)


def _make_options(base: EnqueueOptions, given: dict[str, Any]) -> EnqueueOptions:
    allowed = EnqueueOptions.__dataclass_fields__
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise InvalidJobError(
            f"unknown enqueue option(s) {', '.join(unknown)}; known: {', '.join(allowed)}"
        )
    if "after_failure" in given and given["after_failure"] not in ("cancel", "run"):
        raise InvalidJobError(
            f"after_failure must be 'cancel' or 'run', got {given['after_failure']!r}"
        )
    if "unique" in given:
        resolve_unique(utcnow(), given["unique"])  # refused now, not at enqueue
    return replace(base, **given)


def check_task_fair_key(task: str, fair_key: object) -> str | None:
    """A task's default fair key, refused at registration when it is not a name."""
    if fair_key is BY_LIMIT_KEY or fair_key is None:
        return fair_key  # BY_LIMIT_KEY: by limit_key
    try:
        return validate_name("fair_key", fair_key)
    except InvalidJobError as exc:
        raise ConfigurationError(f"task {task!r}: {exc}") from None


def check_timeout(task: str, timeout: object) -> float | None:
    """A task's timeout in seconds, refused when it is not a positive finite duration."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigurationError(
            f"task {task!r}: timeout must be a positive, finite number of seconds "
            f"(or a timedelta), got {timeout!r}"
        )
    return float(seconds)
