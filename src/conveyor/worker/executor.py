"""Running one claimed job's handler and turning what happened into an outcome.

The one execution path of conveyor: the worker runs handlers here (sync ones on
its handler threads, async ones on its event loop), and so do the testing
helpers, inline. Nothing here touches the store; outcomes go to the completer.

Whatever goes wrong between a claim and its outcome ends in an outcome: a
payload that cannot be decoded, a result that cannot be stored, a ``Retry``
with a delay out of range, a backoff that raises. Such a job fails at once,
with an error that says what happened, and is not retried when a retry would
only do the same again. A task this worker does not know is the exception:
another worker of the fleet may know it (a rolling deploy), so a worker passes
the job on (``unknown_task_outcome``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import random
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from conveyor.context import Context
from conveyor.encryption import PayloadCodec
from conveyor.errors import EncryptedPayloadError, Fail, InvalidJobError, Retry, UnknownTaskError
from conveyor.job import MAX_RUN_AT, Job, encode_json, seconds_later, utcnow
from conveyor.logs import job_fields, spelled_duration
from conveyor.middleware import Attempt, Middleware, OutcomeName, run_after, run_before
from conveyor.store.records import Finish, FinishKind
from conveyor.task import Task
from conveyor.worker.forks import exit_if_forked, mark_handler_thread

log = logging.getLogger("conveyor.worker")


@dataclass(slots=True)
class Outcome:
    """How an attempt ended, before it is recorded (see FinishKind)."""

    kind: FinishKind
    result_json: str | None = None
    error: str | None = None
    #: retry and snooze: when the job runs again.
    run_at: datetime | None = None

    def finish(self, job_id: int, token: str) -> Finish:
        return Finish(job_id, token, self.kind, self.result_json, self.error, self.run_at)


@dataclass(eq=False, slots=True)
class Running:
    """One attempt of a job this process holds under a lease.

    Owned by the thread that claimed it (the worker's control loop), except
    ``outcome``, which the handler's thread writes once before handing the
    attempt back through the loop's inbox.
    """

    job: Job
    task: Task[Any, Any] | None
    context: Context
    started: float = field(default_factory=time.monotonic)
    #: Monotonic deadline from the task's timeout, if any.
    deadline: float | None = None
    #: Why the worker asked the handler to stop: "cancel", "timeout", "shutdown"
    #: or "lease lost". The handler may not listen; the attempt stays held until it returns.
    abort: str | None = None
    #: The handler returned (its outcome is set) and was handed back.
    returned: bool = False
    #: With middleware: the handler returned and its outcome is settled, though the
    #: after-hooks may still run (a drain that stops waiting records that outcome).
    handled: bool = False
    #: What the handler's run came to (set by the handler's thread).
    outcome: Outcome | None = None
    #: The outcome handed to the completer (after a cancel or a timeout, not the
    #: handler's own); set while its write is awaited.
    recorded: Outcome | None = None
    #: For async handlers: the asyncio task, to cancel it.
    async_task: asyncio.Task[Any] | None = None
    #: The payload, decoded once when the job was checked.
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: The App's middleware chain, around the handler (empty: nothing to call).
    middleware: tuple[Middleware, ...] = ()

    @property
    def token(self) -> str:
        assert self.job.lease_token is not None
        return self.job.lease_token

    @property
    def id(self) -> int:
        return self.job.id


def poison_outcome(
    running: Running, fleet: Fleet | None = None, codec: PayloadCodec | None = None
) -> Outcome | None:
    """An outcome for a job that cannot run here: unknown task or undecodable payload.

    Decodes the payload into ``running.args`` and ``running.kwargs`` on the way,
    opened with ``codec`` first when the App has encryption keys (arguments no
    key opens fail the job: the handler never runs on ciphertext).
    With ``fleet`` (a worker), a job of an unknown task is passed on to the
    fleet; without (inline, where the process runs its own jobs), it fails.
    """
    job, task = running.job, running.task
    if task is None:
        if fleet is not None:
            return unknown_task_outcome(job, fleet, utcnow())
        message = f"no task named {job.task!r} is registered with this worker"
        return Outcome("fail", error=str(UnknownTaskError(message)))
    if codec is not None:
        codec.open_job(job)
    try:
        running.args, running.kwargs = job.args, job.kwargs
    except PAYLOAD_ERRORS as exc:
        return undecodable(exc)
    if task.arguments is not None:
        try:
            running.args, running.kwargs = task.arguments.load(running.args, running.kwargs)
        except InvalidJobError as exc:  # no attempt could make them fit
            return Outcome("fail", error=f"InvalidJobError: {exc} (not retried)")
    return None


@dataclass(frozen=True, slots=True)
class Fleet:
    """What a worker passes a job of a task it does not know on with."""

    #: The worker's id, named in the job's error.
    worker: str
    #: Seconds, from the first worker that did not know the task, before its job fails.
    patience: float = 24 * 3600.0


#: Longest a job of a task this worker does not know waits before a worker looks again.
UNKNOWN_TASK_MAX_DELAY = 300.0
#: How the error of a job passed on says since when no worker knew its task.
_UNKNOWN_SINCE = re.compile(r"\(unknown since (\S+)\)$")


def unknown_task_outcome(job: Job, fleet: Fleet, now: datetime) -> Outcome:
    """A job of a task this worker does not know: passed on, or failed once patience runs out.

    In a rolling deploy the workers of the release before meet the jobs of
    tasks only the new release has: failing them would lose work that another
    worker could do. So the job is snoozed (queued again, its attempt given
    back) with a delay that grows with how long no worker has known its task,
    from about a second to UNKNOWN_TASK_MAX_DELAY; after ``fleet.patience`` it fails
    for good. When that began rides in the job's own error, the one field a
    snooze writes: nothing is added to the claim or to the schema, and a job
    whose task is known pays nothing.
    """
    name = job.task
    since = unknown_since(job.error) or now
    waited = (now - since).total_seconds()
    if waited >= fleet.patience:
        return Outcome(
            "fail",
            error=(
                f"UnknownTaskError: no worker knew task {name!r} for {spelled_duration(waited)} "
                f"(since {since.isoformat()}); failed for good. Deploy a worker that "
                "registers it, then retry the job"
            ),
        )
    # A quarter of the time waited so far: each pass a little later than the one
    # before (a worker that knows the task gets many turns while a deploy rolls,
    # a fleet where none does looks less and less often), spread by a jitter so
    # that jobs passed on together do not all come back in the same instant.
    delay = min(max(waited / 4, 1.0), UNKNOWN_TASK_MAX_DELAY) * random.uniform(0.8, 1.2)
    return Outcome(
        "snooze",
        error=(
            f"UnknownTaskError: no task named {name!r} is registered with worker "
            f"{fleet.worker}; passed on to a worker that knows it "
            f"(unknown since {since.isoformat()})"
        ),
        run_at=now + timedelta(seconds=delay),
    )


def unknown_since(error: str | None) -> datetime | None:
    """Since when no worker knew a job's task, as its error says (None: it does not say)."""
    found = _UNKNOWN_SINCE.search(error or "")
    if found is None:
        return None
    try:
        since = datetime.fromisoformat(found.group(1))
    except ValueError:
        return None
    return since if since.tzinfo is not None else None


#: What decoding a stored payload may raise: the job can never run.
PAYLOAD_ERRORS = (ValueError, RecursionError, MemoryError)


def undecodable(exc: BaseException) -> Outcome:
    """The failure of a job whose payload cannot be decoded (not retried)."""
    if isinstance(exc, EncryptedPayloadError):
        # Another worker may hold the key: the error says so, and a retry once
        # the keys are right runs the job.
        return Outcome("fail", error=f"EncryptedPayloadError: {exc}")
    return Outcome("fail", error=f"undecodable payload: {type(exc).__name__}: {exc}")


def outcome_of_result(result: Any) -> Outcome:
    try:
        return Outcome("complete", result_json=encode_json("result", result))
    except InvalidJobError as exc:
        # Not retried: the handler would return the same kind of value again,
        # repeating its side effects for nothing.
        return Outcome("fail", error=f"the handler's return value cannot be stored: {exc}")


def outcome_of_exception(exc: BaseException, running: Running, now: datetime) -> Outcome:
    if isinstance(exc, Retry):
        return Outcome("snooze", run_at=run_again_at(now, exc.delay, "Retry delay"))
    if isinstance(exc, TypeError) and running.task is not None:
        # The call itself may have failed: arguments the handler cannot take
        # (enqueued by name from a process that does not know the task, or
        # before the handler's signature changed). Binding them again tells;
        # no retry could fix them. Checked here, after the TypeError, so that
        # the calls that fit pay nothing for it.
        mismatch = running.task.binding_error(running.args, running.kwargs)
        if mismatch is not None:
            return Outcome("fail", error=f"InvalidJobError: {mismatch} (not retried)")
    error = "".join(traceback.format_exception(exc))
    if isinstance(exc, Fail):
        return Outcome("fail", error=error)
    return Outcome("retry", error=error, run_at=backoff_at(running, now))


def backoff_at(running: Running, now: datetime) -> datetime:
    """When a failed attempt runs again, from the task's backoff policy."""
    assert running.task is not None
    return run_again_at(now, running.task.backoff.delay(running.job.attempts), "backoff delay")


def run_again_at(now: datetime, delay: Any, what: str) -> datetime:
    """``now + delay`` (seconds or a timedelta), or InvalidJobError when it is out of range."""
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidJobError(f"{what} must be a number of seconds, got {delay!r}")
    if not math.isfinite(seconds) or not seconds >= 0:
        raise InvalidJobError(f"{what} must be a finite number of seconds >= 0, got {delay!r}")
    when = seconds_later(now, seconds)
    if when >= MAX_RUN_AT:
        raise InvalidJobError(f"{what} of {delay!r} seconds runs past the year 9999")
    return when


def apply_abort(running: Running) -> None:
    """The outcome to record, once the handler returned: its own, unless it was asked to stop.

    Read once, in the handler's thread when it returns (or by the control loop
    for an attempt that never started), so that the middleware hears of the
    outcome the worker records. A stop asked after the handler returned comes
    too late to change it. A lost lease keeps the outcome: the worker drops it.
    """
    reason = running.abort
    if reason is None or reason == "lease lost":
        return
    if reason == "cancel":
        running.outcome = Outcome("cancelled")
    elif reason == "timeout":
        assert running.task is not None
        error = f"TimeoutError: job {running.id} ran past its timeout of {running.task.timeout}s"
        running.outcome = settle(
            running, lambda: Outcome("retry", error=error, run_at=backoff_at(running, utcnow()))
        )
    elif reason == "shutdown":
        # Asked to stop by a drain: whatever it returned is taken as cut short.
        running.outcome = Outcome("release")


#: The name of what became of an attempt, by its outcome's kind (retry: see outcome_name).
OUTCOME_NAMES: dict[str, OutcomeName] = {
    "complete": "succeeded",
    "retry": "retried",
    "fail": "failed",
    "snooze": "snoozed",
    "release": "released",
    "cancelled": "cancelled",
}


def outcome_name(job: Job, outcome: Outcome) -> OutcomeName:
    """What becomes of the job: a retry on its last attempt fails it."""
    if outcome.kind == "retry" and job.attempts >= job.max_attempts:
        return "failed"
    return OUTCOME_NAMES[outcome.kind]


def settle(running: Running, compute: Callable[[], Outcome]) -> Outcome:
    """``compute()``, or a failure saying why no outcome could be made of the attempt."""
    try:
        return compute()
    # Anything: a backoff policy that raises KeyboardInterrupt must not leave the
    # attempt without an outcome (its job would stay running until the worker stops).
    except BaseException as exc:
        return Outcome(
            "fail",
            error=(
                f"conveyor could not record job {running.id}'s outcome: {type(exc).__name__}: {exc}"
            ),
        )


def escaped(running: Running, exc: BaseException) -> None:
    """Something left the executor itself (not the handler, whose exceptions are its outcome).

    The thread that ran the attempt is told, and the attempt still ends: with
    its handler's outcome when it had one, else failed, naming what escaped.
    So no exception, whatever its class, leaves a job running in a thread that
    died.
    """
    log.error(
        "job %s: %s escaped while its attempt ended",
        running.id,
        type(exc).__name__,
        exc_info=exc,
        extra=job_fields(running.job),
    )
    if running.outcome is None:
        running.outcome = Outcome(
            "fail",
            error=(
                f"conveyor could not record job {running.id}'s outcome: {type(exc).__name__}: {exc}"
            ),
        )


def call_args(running: Running) -> tuple[list[Any], dict[str, Any]]:
    assert running.task is not None
    args = running.args
    if running.task.takes_context:
        args = [running.context, *args]
    return args, running.kwargs


def run_sync(running: Running) -> None:
    """Run a sync handler in this thread; its outcome ends up in ``running.outcome``."""
    if running.middleware:
        # A fresh copy of the thread's context for each attempt: what the hooks
        # and the handler set in context variables ends with the attempt.
        contextvars.copy_context().run(_run_sync_in_middleware, running)
        return
    _call_sync(running)
    apply_abort(running)


def _run_sync_in_middleware(running: Running) -> None:
    attempt = Attempt(running.job, running.context)
    entered = run_before(running.middleware, "before_attempt", attempt)
    result, exception = _call_sync(running)
    apply_abort(running)
    running.handled = True
    end_attempt(running, attempt, entered, result, exception)


def _call_sync(running: Running) -> tuple[Any, BaseException | None]:
    """Call the handler; set the outcome; return what it returned or raised."""
    assert running.task is not None
    owner = os.getpid()
    try:
        args, kwargs = call_args(running)
        result = running.task.fn(*args, **kwargs)
    except BaseException as exc:
        exit_if_forked(owner, exc)
        caught = exc
        running.outcome = settle(running, lambda: outcome_of_exception(caught, running, utcnow()))
        return None, caught
    exit_if_forked(owner, None)
    running.outcome = settle(running, lambda: outcome_of_result(result))
    return result, None


async def run_async(running: Running) -> None:
    """Run an async handler on this event loop; its outcome ends up in ``running.outcome``.

    With middleware, the hooks run in the handler's own asyncio task (which has
    a context of its own): what they set in context variables, the handler sees.
    """
    if not running.middleware:
        await _call_async(running)
        apply_abort(running)
        return
    attempt = Attempt(running.job, running.context)
    entered = run_before(running.middleware, "before_attempt", attempt)
    result, exception = await _call_async(running)
    apply_abort(running)
    running.handled = True
    end_attempt(running, attempt, entered, result, exception)


async def _call_async(running: Running) -> tuple[Any, BaseException | None]:
    """Await the handler; set the outcome; return what it returned or raised."""
    assert running.task is not None
    running.async_task = asyncio.current_task()
    owner = os.getpid()
    try:
        if running.abort:  # aborted before it started
            raise asyncio.CancelledError
        args, kwargs = call_args(running)
        result = await running.task.fn(*args, **kwargs)
        exit_if_forked(owner, None)
    except asyncio.CancelledError as exc:
        exit_if_forked(owner, exc)
        if running.abort:
            # The worker cancelled it; what the attempt records follows from why.
            running.outcome = Outcome("release")
        else:  # a handler that cancels itself fails like any other exception
            cancelled = exc
            running.outcome = settle(
                running, lambda: outcome_of_exception(cancelled, running, utcnow())
            )
        return None, exc
    except BaseException as exc:
        exit_if_forked(owner, exc)
        caught = exc
        running.outcome = settle(running, lambda: outcome_of_exception(caught, running, utcnow()))
        return None, caught
    running.outcome = settle(running, lambda: outcome_of_result(result))
    return result, None


def end_attempt(
    running: Running,
    attempt: Attempt,
    entered: list[Middleware],
    result: Any,
    exception: BaseException | None,
) -> None:
    """Tell the middleware how the attempt ended (its outcome is set), in reverse order."""
    outcome = running.outcome
    assert outcome is not None
    attempt.outcome = outcome_name(running.job, outcome)
    attempt.result = result if outcome.kind == "complete" else None
    attempt.exception = exception
    attempt.error = outcome.error
    run_after(entered, "after_attempt", (attempt,))


def run_inline(running: Running) -> None:
    """Run a handler in this thread, sync or async: the testing helpers' way."""
    assert running.task is not None
    if not running.task.is_async:
        run_sync(running)
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(run_async(running))
        return
    # Inside a running event loop (an async test): a loop of its own, on a thread.
    thread = threading.Thread(
        target=lambda: asyncio.run(run_async(running)), name="conveyor-inline-async"
    )
    thread.start()
    thread.join()


class EventLoopThread:
    """An asyncio event loop the worker owns, for async handlers.

    Jobs arrive in batches: one call into the loop per claim, not one per job.
    """

    def __init__(self, done: Callable[[Running], None]) -> None:
        self.loop = asyncio.new_event_loop()
        self._done = done
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="conveyor-async", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        mark_handler_thread()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Let cancelled handlers finish their cleanup before the loop closes.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def submit(self, runnings: list[Running]) -> None:
        self.loop.call_soon_threadsafe(self._start, runnings)

    def _start(self, runnings: list[Running]) -> None:
        for running in runnings:
            task = self.loop.create_task(self._run_one(running))
            # The loop keeps only weak references to its tasks.
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_one(self, running: Running) -> None:
        try:
            await run_async(running)
        # Anything: a KeyboardInterrupt or SystemExit leaving a task stops the
        # whole event loop, and every async attempt with it.
        except BaseException as exc:
            escaped(running, exc)
        self._done(running)

    def cancel(self, running: Running) -> None:
        self.loop.call_soon_threadsafe(self._cancel, running)

    @staticmethod
    def _cancel(running: Running) -> None:
        if running.async_task is not None:
            running.async_task.cancel()

    def close(self, timeout: float = 5.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
