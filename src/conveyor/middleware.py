"""Middleware: code that wraps every enqueue and every attempt of a job.

A middleware subclasses ``Middleware`` and overrides the hooks it needs:

- ``before_enqueue(enqueue)`` / ``after_enqueue(enqueue, jobs, error)`` around
  each enqueue call, in the caller's process and thread: ``enqueue.headers``
  set here are stored with every job of the call, and read on the worker side
  as ``job.headers``;
- ``before_attempt(attempt)`` / ``after_attempt(attempt)`` around each attempt:
  in the worker (in the handler's own thread, or its asyncio task), in a
  ``consume`` loop (from the hand-out of a job to its end) and inline. A
  context variable set before the attempt is seen by the handler and after it;
  each attempt starts from a clean copy, so nothing leaks into the next one.

Before-hooks run in the order declared, after-hooks in the reverse order; an
after-hook runs for each middleware whose before-hook returned. The chain of
an App is the globally installed middleware (``install``: instrumentors)
followed by its own (``App(middleware=[...])``).

A hook that raises is logged with its traceback (logger
``conveyor.middleware``) and the enqueue or the attempt goes on as if the hook
had done nothing: a middleware never loses a job nor changes its outcome.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import Job, NewJob, check_headers
from conveyor.logs import job_fields

if TYPE_CHECKING:
    from conveyor.context import Context

log = logging.getLogger("conveyor.middleware")

#: What became of an attempt, as ``after_attempt`` sees it (and the worker's log says):
#: ``retried`` is a failed attempt that will run again, ``failed`` one that will not.
OutcomeName = Literal["succeeded", "failed", "retried", "snoozed", "cancelled", "released"]


@dataclass(eq=False, slots=True)
class Enqueue:
    """One enqueue call, as the middleware sees it before and after the insert."""

    #: The jobs about to be inserted, checked and encoded (read them; see ``headers``).
    jobs: list[NewJob]
    #: Headers to store with every job of the call (a middleware's win over the caller's).
    headers: dict[str, str] = field(default_factory=dict)
    #: For the middleware's own use between its before and after hooks.
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str | None:
        """The task of the jobs; None when they name several (``app.enqueue_many``)."""
        return _shared(job.task for job in self.jobs)

    @property
    def queue(self) -> str | None:
        """The queue of the jobs; None when they go to several (``app.enqueue_many``)."""
        return _shared(job.queue for job in self.jobs)


@dataclass(eq=False, slots=True)
class Attempt:
    """One attempt of a job: from its start (or its hand-out by ``consume``) to its end."""

    #: The job as claimed (``job.attempts`` counts this attempt; ``job.headers``).
    job: Job
    #: The handler's Context (its cancel signal, progress).
    context: Context
    #: For the middleware's own use between its before and after hooks.
    state: dict[str, Any] = field(default_factory=dict)
    #: Set for after_attempt: what becomes of the job (see OutcomeName).
    outcome: OutcomeName | None = None
    #: What the handler returned, when it succeeded.
    result: Any = None
    #: What the handler raised (or the exception a consumer failed the job with).
    exception: BaseException | None = None
    #: The error recorded with the job (a traceback, or why it could not run), if any.
    error: str | None = None

    @property
    def failed(self) -> bool:
        """Whether the attempt failed (``failed`` or ``retried``)."""
        return self.outcome in ("failed", "retried")


class Middleware:
    """The base of every middleware: each hook does nothing until overridden.

    One instance serves every enqueue and attempt of the process, from many
    threads at once: keep what belongs to one call in ``enqueue.state`` or
    ``attempt.state`` (or in context variables), not on ``self``.
    """

    def before_enqueue(self, enqueue: Enqueue) -> None:
        """Before the jobs are inserted: add ``enqueue.headers``, start a span."""

    def after_enqueue(
        self, enqueue: Enqueue, jobs: list[Job] | None, error: BaseException | None
    ) -> None:
        """After the insert: the jobs it gave (None when it raised ``error``)."""

    def before_attempt(self, attempt: Attempt) -> None:
        """Before the handler runs (in its thread or task), or when consume hands the job out."""

    def after_attempt(self, attempt: Attempt) -> None:
        """After the handler returned, before the outcome is recorded: ``attempt.outcome``."""


# --- the global chain: instrumentors every App includes ---------------------------------

_installed: tuple[Middleware, ...] = ()
_lock = threading.Lock()


def install(middleware: Middleware) -> None:
    """Add a middleware to every App of this process, before the App's own (once)."""
    global _installed
    check_middleware([middleware])
    with _lock:
        if not any(m is middleware for m in _installed):
            _installed = (*_installed, middleware)


def uninstall(middleware: Middleware) -> None:
    """Remove a middleware ``install`` added; nothing happens when it is not installed."""
    global _installed
    with _lock:
        _installed = tuple(m for m in _installed if m is not middleware)


def installed() -> tuple[Middleware, ...]:
    """The globally installed middleware, in order."""
    return _installed


def chain(own: tuple[Middleware, ...]) -> tuple[Middleware, ...]:
    """An App's chain: the installed middleware, then its own (often both empty)."""
    return _installed + own if _installed else own


def check_middleware(given: Iterable[object] | None) -> tuple[Middleware, ...]:
    """The middleware an App was given, each checked to be a Middleware instance."""
    if given is None:
        return ()
    if isinstance(given, Middleware):
        raise ConfigurationError("middleware must be a list: middleware=[MyMiddleware()]")
    chosen: list[Middleware] = []
    for item in given:
        if isinstance(item, type) and issubclass(item, Middleware):
            raise ConfigurationError(
                f"middleware: pass an instance, {item.__name__}(), not the class"
            )
        if not isinstance(item, Middleware):
            raise ConfigurationError(
                f"middleware must be instances of conveyor.Middleware (subclass it), "
                f"got {type(item).__name__}"
            )
        chosen.append(item)
    return tuple(chosen)


# --- running the hooks -----------------------------------------------------------------


# A hook that raises anything is logged and passed over, KeyboardInterrupt,
# SystemExit and GeneratorExit too: the hooks run in the handler's thread or
# asyncio task, where such an exception would end the thread (or stop the event
# loop) before the attempt's outcome is handed back, and the worker would hold
# the job, renewing its lease, until it stopped. No signal raises there: Python
# delivers KeyboardInterrupt to the main thread only, so one raised in a
# worker's hook is the hook's own doing, not an operator's Ctrl-C. (In inline
# mode and consume the caller's thread runs the hooks: a Ctrl-C landing in one
# is logged like the rest, the job ends, and the next Ctrl-C stops the caller.)


def run_before(chain: Sequence[Middleware], hook: str, subject: Any) -> list[Middleware]:
    """Call a before-hook of each middleware in order; return those whose hook returned."""
    entered = []
    for middleware in chain:
        try:
            getattr(middleware, hook)(subject)
        except BaseException:
            _failed(middleware, hook, subject)
        else:
            entered.append(middleware)
    return entered


def run_after(entered: Sequence[Middleware], hook: str, args: tuple[Any, ...]) -> None:
    """Call an after-hook of each entered middleware, in reverse order."""
    for middleware in reversed(entered):
        try:
            getattr(middleware, hook)(*args)
        except BaseException:
            _failed(middleware, hook, args[0])


def _failed(middleware: Middleware, hook: str, subject: Attempt | Enqueue) -> None:
    if isinstance(subject, Attempt):
        what, fields = "attempt", job_fields(subject.job)
    else:
        what, fields = "enqueue", enqueue_fields(subject)
    log.exception(
        "middleware %s: %s raised; the %s goes on without it",
        type(middleware).__name__,
        hook,
        what,
        extra=fields,
    )


def around_enqueue(
    chain: Sequence[Middleware], jobs: list[NewJob], insert: Callable[[], list[Job]]
) -> list[Job]:
    """Run ``insert()`` (which inserts ``jobs``) inside the chain's enqueue hooks."""
    enqueue = Enqueue(jobs)
    entered = run_before(chain, "before_enqueue", enqueue)
    add_headers(enqueue)
    try:
        inserted = insert()
    except BaseException as exc:
        run_after(entered, "after_enqueue", (enqueue, None, exc))
        raise
    run_after(entered, "after_enqueue", (enqueue, inserted, None))
    return inserted


def enqueue_fields(enqueue: Enqueue) -> dict[str, Any]:
    """Log fields of an enqueue: its task and queue, when the jobs share them."""
    return {"task": enqueue.task, "queue": enqueue.queue, "jobs": len(enqueue.jobs)}


def add_headers(enqueue: Enqueue) -> None:
    """Store the middleware's headers with each job, leaving out (and logging) bad ones."""
    for job in enqueue.jobs:
        merged = {**job.headers, **enqueue.headers} if job.headers else dict(enqueue.headers)
        if not merged:
            job.headers = None
            continue
        try:
            job.headers = check_headers(merged)
        except InvalidJobError as exc:
            job.headers = _storable_part(merged)
            log.error(
                "middleware headers left out of a job of task %s: %s",
                job.task,
                exc,
                extra={"task": job.task, "queue": job.queue},
            )


def _storable_part(headers: dict[Any, Any]) -> dict[str, str] | None:
    """The headers that can be stored, one by one, within the size limit."""
    kept: dict[str, str] = {}
    for name, value in headers.items():
        try:
            kept = check_headers({**kept, name: value}) or {}
        except InvalidJobError:
            continue
    return kept or None


def _shared(values: Iterable[str]) -> str | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None
