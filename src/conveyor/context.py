"""What a handler sees of its job: ids, progress, the cancel signal, a manual heartbeat,
durable steps, and completing the job in the handler's own transaction."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.errors import (
    ChildFailed,
    ConfigurationError,
    Fail,
    InvalidJobError,
    LeaseLostError,
    Parked,
    Retry,
    SignalTimeout,
    Sleeping,
    StoreUnavailableError,
)
from conveyor.job import (
    Job,
    JobState,
    encode_json,
    lost_parent_error,
    storable_text,
    utcnow,
    validate_name,
)
from conveyor.limits import throttle_seconds
from conveyor.logs import job_fields
from conveyor.pacing import DutyBackoff

if TYPE_CHECKING:
    from conveyor.store.records import Relative, Step
    from conveyor.store.signals import SignalWait

log = logging.getLogger("conveyor.worker")
#: The header that names the job a child was spawned by (``ctx.spawn``).
SPAWNED_BY = "conveyor-spawned-by"
#: The longest a parent waiting for its children goes without looking (seconds).
CHILDREN_POLL_MAX = 30.0
#: The longest ``ctx.sleep``: ten years.
MAX_SLEEP = timedelta(days=3650)
#: Failed telemetry writes (progress, a handler's heartbeat) of every job, logged
#: as one duty: an outage is one warning now and then, not one per job and call.
_TELEMETRY = DutyBackoff("a progress or heartbeat write", log)

#: One lock for every job's cancel signal: setting and waiting are rare next to
#: the jobs themselves, and a lock per job was a measurable cost of each claim.
_SIGNAL_LOCK = threading.Lock()


class CancelSignal:
    """Set when the job should stop: cancelled by a user, timed out, or the worker is draining.

    Sync handlers check ``is_set()`` (or ``wait(timeout)``) between steps;
    async handlers may ``await signal.wait_async()``, though an async handler
    is also cancelled outright (it sees ``asyncio.CancelledError``).
    """

    __slots__ = ("_event", "_set", "_waiters", "reason")

    def __init__(self) -> None:
        self._set = False
        # Created on the first wait() only: most jobs are never cancelled, and a
        # threading.Event (or a lock) per job is a measurable cost on the claim path.
        self._event: threading.Event | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None
        self.reason: str | None = None

    def is_set(self) -> bool:
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        with _SIGNAL_LOCK:
            if self._set:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with _SIGNAL_LOCK:
            if self._set:
                return
            if self._waiters is None:
                self._waiters = []
            self._waiters.append((loop, future))
        await future

    def set(self, reason: str) -> None:
        with _SIGNAL_LOCK:
            if self._set:
                return
            self.reason = reason
            self._set = True
            if self._event is not None:
                self._event.set()
            waiters, self._waiters = self._waiters or [], None
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


#: Progress is written to the store at most this often per job (seconds); calls
#: in between reach this process's listeners at once and the store later.
PROGRESS_WRITE_INTERVAL = 1.0

#: One lock for the progress of every job: progress is rare next to the jobs
#: themselves, and a lock per job was a measurable cost of each claim.
_PROGRESS_LOCK = threading.Lock()


class Hooks(Protocol):
    """What a Context asks of whoever runs its job (the worker, or the inline runner)."""

    def write_progress(self, job: Job, fraction: float | None, message: str | None) -> bool:
        """Write progress to the store under the job's lease; False when the lease is lost."""
        ...

    def publish_progress(self, job: Job, fraction: float | None, message: str | None) -> None:
        """Tell listeners in this process (``job.wait(on_progress=...)``) at once."""
        ...

    def heartbeat(self, job: Job) -> bool:
        """Renew the job's lease now; False when it is lost."""
        ...

    def throttle(self, job: Job, seconds: float, whole_queue: bool) -> datetime:
        """Hold the job's limit key (or queue) back for ``seconds``; when it ends."""
        ...

    def parents(self, job: Job) -> list[Relative]:
        """The edges onto the jobs ``job`` waited for (``after=``), as stored now."""
        ...

    def steps(self, job: Job) -> list[Step]:
        """The durable steps the job recorded (in any attempt)."""
        ...

    def record_step(
        self, job: Job, name: str, result_json: str, started_at: datetime
    ) -> Step | None:
        """Record a step under the job's lease; the step as recorded, None if the lease is lost."""
        ...

    def complete_in(self, job: Job, connection: Any, result_json: str) -> bool:
        """Record the job's success in the caller's transaction; False when the lease is lost."""
        ...

    def jobs(self, ids: list[int]) -> list[Job]:
        """The jobs of ``ids`` as stored now (those still stored), their values opened."""
        ...

    def park_children(
        self, job: Job, step: str, children: list[int], until: datetime
    ) -> str | None:
        """'ended' when every child has ended, else park the job until ``until``
        (``SignalStore.children_park``); None when the lease is lost."""
        ...

    def mark_sleep(
        self, job: Job, step: str, until: datetime, over_from: datetime
    ) -> datetime | None:
        """Mark that the job sleeps until ``until`` (an earlier mark keeps its time),
        under its lease (``SignalStore.sleep_mark``): the time marked; None when the
        lease is lost. A store that keeps no waits answers ``until``."""
        ...

    def wait_signal(self, job: Job, name: str, step: str, until: datetime) -> SignalWait | None:
        """Take signal ``name`` as step ``step``, or time out, or park the job until
        ``until`` (``SignalStore.signal_wait``); None when the lease is lost."""
        ...


@dataclass(slots=True)
class Context:
    """Passed to a handler whose first parameter is annotated ``Context``."""

    job: Job
    cancelled: CancelSignal = field(default_factory=CancelSignal)
    #: Whoever runs the job: one reference, not a closure per job and per hook.
    _hooks: Hooks | None = field(default=None, repr=False)
    _progress_pending: tuple[float | None, str | None] | None = field(default=None, repr=False)
    _progress_written_at: float = field(default=-PROGRESS_WRITE_INTERVAL, repr=False)
    _parents: list[Relative] | None = field(default=None, repr=False)
    #: The job's recorded steps by name, read at the first step; names used in this attempt.
    _steps: dict[str, Step] | None = field(default=None, repr=False)
    _steps_run: set[str] | None = field(default=None, repr=False)
    #: ctx.complete wrote the job's success in the caller's transaction (which the
    #: caller may still roll back): the worker expects its own finish to find it done.
    completed_in_transaction: bool = field(default=False, repr=False)
    #: ctx.sleep calls in this attempt (each names its step by its number).
    _sleeps: int = field(default=0, repr=False)
    #: ctx.wait_for calls in this attempt, by signal name (each step named by its number).
    _signal_waits: dict[str, int] | None = field(default=None, repr=False)
    #: ctx.spawn and ctx.wait calls in this attempt (each names its step by its number).
    _spawns: int = field(default=0, repr=False)
    _child_waits: int = field(default=0, repr=False)
    #: A wait parked the job in the store (queued it for the wait's end): the worker
    #: records nothing more of this attempt.
    parked: bool = field(default=False, repr=False)

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def parents(self) -> list[Job]:
        """The jobs this one waited for (enqueued with ``after=``) that are still
        stored, read once, by id (a deleted one is named in ``upstream_errors``)."""
        return [r.job for r in self._edges() if r.job is not None]

    def _edges(self) -> list[Relative]:
        if self._parents is None:
            self._parents = [] if self._hooks is None else self._hooks.parents(self.job)
        return self._parents

    @property
    def upstream(self) -> dict[int, Any]:
        """The results of the jobs this one waited for that succeeded, by job id.

        A parent that failed or was cancelled (a job enqueued with
        ``after_failure="run"``) is absent: see ``upstream_errors``.
        """
        return {p.id: p.result for p in self.parents if p.state == JobState.SUCCEEDED}

    @property
    def upstream_errors(self) -> dict[int, str]:
        """The errors of the jobs this one waited for that failed or were cancelled,
        by id; a parent deleted since (its result is gone with it) is named too:
        ``job 12, which this job waits for, was deleted``."""
        errors = {}
        for r in self._edges():
            if r.job is None:
                how = r.resolved if r.resolved == "dropped" else "deleted"
                errors[r.id] = lost_parent_error(r.id, how)
            elif r.job.state in (JobState.FAILED, JobState.CANCELLED):
                errors[r.id] = r.job.error or str(r.job.state)
        return errors

    def progress(self, fraction: float | None = None, message: str | None = None) -> bool:
        """Record how far the job is (0.0 to 1.0) and what it does; False if the lease is lost.

        Listeners in this process hear of it at once; the store is written at
        most once a second (the latest value wins), so a handler may call this
        as often as it likes.
        """
        if fraction is not None and not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress fraction must be between 0 and 1, got {fraction}")
        if message is not None:
            message = storable_text(message)
        if self._hooks is not None:
            self._hooks.publish_progress(self.job, fraction, message)
        now = time.monotonic()
        with _PROGRESS_LOCK:
            if now - self._progress_written_at < PROGRESS_WRITE_INTERVAL:
                self._progress_pending = (fraction, message)
                return not self._lease_lost()
            self._progress_written_at = now
            self._progress_pending = None
        return self._write_progress(fraction, message)

    def flush_progress(self) -> None:
        """Write progress that is still waiting for its turn (the worker calls this).

        Never raises: progress that cannot be written stays pending.
        """
        with _PROGRESS_LOCK:
            pending, self._progress_pending = self._progress_pending, None
            if pending is not None:
                self._progress_written_at = time.monotonic()
        if pending is not None:
            self._write_progress(*pending)

    def _write_progress(self, fraction: float | None, message: str | None) -> bool:
        """Write progress now; progress that cannot be written waits for the next flush.

        Progress is telemetry: a store that is away (or refuses the write) must
        not fail the work it reports on, so nothing here raises into the handler.
        The value is kept for the lease keeper's next round unless newer
        progress has replaced it meanwhile.
        """
        if self._hooks is None:
            return False
        try:
            written = self._hooks.write_progress(self.job, fraction, message)
        except Exception as exc:
            with _PROGRESS_LOCK:
                if self._progress_pending is None:
                    self._progress_pending = (fraction, message)
            _TELEMETRY.failed(exc)
            return not self._lease_lost()
        if _TELEMETRY.failures:
            _TELEMETRY.succeeded()
        return written

    def _lease_lost(self) -> bool:
        return self.cancelled.is_set() and self.cancelled.reason == "lease lost"

    def heartbeat(self) -> bool:
        """Renew this job's lease now (the worker also does it every third of the lease).

        False when the lease is lost. While the store is away this cannot be
        known: it answers True and the worker's own renewals keep trying (a
        lease that runs out meanwhile sets ``cancelled``).
        """
        if self._hooks is None:
            return False
        try:
            return self._hooks.heartbeat(self.job)
        except Exception as exc:
            _TELEMETRY.failed(exc)
            return not self._lease_lost()

    def throttle(self, seconds: float | timedelta, *, whole_queue: bool = False) -> Retry:
        """Slow down everyone: hold this job's key, or its queue, back for ``seconds``.

        For a handler told "too many requests" (an HTTP 429): every worker stops
        starting jobs of the job's ``limit_key`` in this queue (of the whole
        queue when the job has none, or with ``whole_queue=True``) until then, so
        one rejection does not become a thousand. Returns a ``Retry`` for this
        job after the same time: ``raise ctx.throttle(30)``.

        While the store is away the hold cannot be written: the other jobs of the
        key are not held back (a warning says so), and this job is still retried
        after ``seconds``, so the handler's flow is the same.
        """
        length = throttle_seconds(seconds)
        if self._hooks is not None:
            try:
                self._hooks.throttle(self.job, length, whole_queue)
            except StoreUnavailableError as exc:
                log.warning(
                    "job %s: could not hold its key back for %gs, the store is away (%s); "
                    "only this job waits",
                    self.job.id, length, exc, extra=job_fields(self.job),
                )  # fmt: skip
        return Retry(delay=length, reason=f"throttled for {length:g}s")

    # --- exactly-once effects (docs/effects.md) ------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name`` of this job.

        Its result is recorded under the job's lease before it is returned; a
        later attempt of the same job (after an exception, a timeout, a crash)
        returns the recorded result instead of calling ``fn`` again. Names must
        be the same on every attempt and used once per attempt; results follow
        the rules of a job's result (JSON) and come back as JSON gives them (a
        tuple as a list), on the first attempt too. An exception of ``fn`` is
        not recorded: it reaches the handler, and a later attempt calls ``fn``
        again. In an async handler, ``await ctx.astep(...)``.
        """
        recorded = self._step_begin(name)
        if recorded is not None:
            return recorded.result
        started = utcnow()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited: no "was never awaited" warning
            # Not retried: every attempt would do the same.
            raise Fail(
                f"step {name!r}: {getattr(fn, '__name__', fn)!r} returned an awaitable; "
                "in an async handler use `await ctx.astep(...)`"
            )
        return self._step_end(name, value, started)

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``ctx.step`` for async handlers: ``fn`` may be a coroutine function (it is awaited).

        The store is read and written on a thread, so the event loop goes on
        running other handlers meanwhile.
        """
        recorded = await asyncio.to_thread(self._step_begin, name)
        if recorded is not None:
            return recorded.result
        started = utcnow()
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return await asyncio.to_thread(self._step_end, name, value, started)

    def _step_begin(self, name: str) -> Step | None:
        """Check the name; the step as recorded by an earlier attempt, or None to run it."""
        try:
            validate_name("step name", name)
        except InvalidJobError as exc:
            raise Fail(str(exc)) from None
        if self._steps_run is None:
            self._steps_run = set()
        if name in self._steps_run:
            raise Fail(
                f"step {name!r} ran twice in one attempt: give each step of a handler its "
                "own name, the same on every attempt (e.g. f'charge-{item_id}')"
            )
        if self._steps is None:
            found = self._hooks.steps(self.job) if self._hooks is not None else []
            self._steps = {step.name: step for step in found}
        recorded = self._steps.get(name)
        if recorded is not None:
            self._steps_run.add(name)
        return recorded

    def _step_end(self, name: str, value: Any, started: datetime) -> Any:
        """Record the step's result; what the step returns (as JSON gives it back)."""
        try:
            result_json = encode_json(f"the result of step {name!r}", value)
        except InvalidJobError as exc:
            # Not retried: the step would run again and return the same kind of value.
            raise Fail(str(exc)) from None
        assert self._steps is not None and self._steps_run is not None
        # An exception of fn left the name free: the handler may call the step again.
        self._steps_run.add(name)
        if self._hooks is None:  # a Context made by hand: nothing to record into
            return json.loads(result_json)
        step = self._hooks.record_step(self.job, name, result_json, started)
        if step is None:
            raise LeaseLostError(
                f"job {self.job.id}: its lease was lost (another worker may run it now); "
                f"step {name!r} ran but was not recorded"
            )
        self._steps[name] = step
        return step.result

    def sleep(self, duration: float | timedelta | datetime, *, name: str | None = None) -> None:
        """Sleep durably: end this attempt and go on after ``duration`` (seconds or a
        timedelta) or at ``duration`` (an aware datetime), in a later attempt.

        The wake time is recorded as a durable step before the attempt ends, and
        the job is queued again for it without using up an attempt, a worker
        slot or a lease; any worker resumes it, and the handler runs again from
        the top: its recorded steps return their results, and this sleep, once
        its time has come, returns at once. A crash after the wake time was
        recorded sleeps on until that time. Sleeps are named ``sleep-1``,
        ``sleep-2``... in the order the handler reaches them; give ``name`` when
        that order can change between runs. Raises ``Sleeping`` (a ``Retry``):
        let it through. In an async handler, ``await ctx.asleep(...)``.
        """
        self._sleeps += 1
        step = name if name is not None else f"sleep-{self._sleeps}"
        recorded = self._step_begin(step)
        if recorded is None:
            until = wake_time(utcnow(), duration)
            self._step_end(step, {"until": until.isoformat()}, utcnow())
        else:
            until = datetime.fromisoformat(recorded.result["until"])
        # Over once the job was queued for its wake time (or later): not cut
        # short by a rescue after a crash, which leaves the old run_at.
        over_from = max(utcnow(), self.job.run_at)
        if self._hooks is not None:
            # Marked as the job's wait while it sleeps (seen, counted as parked),
            # ended once over; an operator's wake marked it over early.
            marked = self._hooks.mark_sleep(self.job, step, until, over_from)
            if marked is None:
                raise LeaseLostError(
                    f"job {self.job.id}: its lease was lost (another worker may run it now) "
                    "while it slept"
                )
            until = marked
        if until > over_from:
            raise Sleeping(until, (until - utcnow()).total_seconds())

    async def asleep(
        self, duration: float | timedelta | datetime, *, name: str | None = None
    ) -> None:
        """``ctx.sleep`` for async handlers: the step is read and written on a thread."""
        await asyncio.to_thread(self.sleep, duration, name=name)

    def wait_for(
        self,
        name: str,
        timeout: float | timedelta | datetime | None = None,
        *,
        step: str | None = None,
    ) -> Any:
        """The payload of signal ``name`` sent to this job (``app.signal``), waiting durably
        for it until ``timeout`` (seconds, a timedelta, or an aware datetime; None: as
        long as a sleep may last).

        A signal sent before the job waits is kept for it: it is returned at once.
        Otherwise the job is parked as ``ctx.sleep`` parks it (no attempt, slot or
        lease used), and the signal's arrival makes it due at once; the handler
        then runs again from the top and this call returns the payload. Each
        signal is taken by one wait, recorded as the durable step
        ``signal-<name>-1`` (``-2``... for later waits of the same name; give
        ``step`` when that order can change): a replay returns the same payload.
        When the timeout passes first, raises ``SignalTimeout`` (catch it to go
        on without the signal). Raises ``Parked`` to park: let it through. In an
        async handler, ``await ctx.await_for(...)``.
        """
        try:
            validate_name("signal name", name)
        except InvalidJobError as exc:
            raise Fail(f"ctx.wait_for: {exc}") from None
        if self._signal_waits is None:
            self._signal_waits = {}
        number = self._signal_waits[name] = self._signal_waits.get(name, 0) + 1
        step_name = step if step is not None else f"signal-{name}-{number}"
        recorded = self._step_begin(step_name)
        if recorded is None:
            now = utcnow()
            until = wake_time(now, MAX_SLEEP if timeout is None else timeout, "ctx.wait_for")
            if self._hooks is None:
                raise ConfigurationError(
                    "ctx.wait_for needs a job run by a worker, by App(inline=True) or by "
                    "conveyor.testing.drain: this Context was made by hand"
                )
            waited = self._hooks.wait_signal(self.job, name, step_name, until)
            if waited is None:
                raise LeaseLostError(
                    f"job {self.job.id}: its lease was lost (another worker may run it now) "
                    f"while it waited for signal {name!r}"
                )
            if waited.outcome == "parked":
                self.parked = True
                delay = max((waited.until - utcnow()).total_seconds(), 0.0)
                raise Parked(waited.until, delay, f"signal {name!r}")
            assert waited.step is not None and self._steps is not None
            recorded = self._steps[step_name] = waited.step
            assert self._steps_run is not None
            self._steps_run.add(step_name)
        result = recorded.result
        if isinstance(result, dict) and "timeout" in result:
            raise SignalTimeout(self.job.id, name, _moment_text(result["timeout"]))
        return result["payload"]

    async def await_for(
        self,
        name: str,
        timeout: float | timedelta | datetime | None = None,
        *,
        step: str | None = None,
    ) -> Any:
        """``ctx.wait_for`` for async handlers: the store is read and written on a thread."""
        return await asyncio.to_thread(self.wait_for, name, timeout, step=step)

    def spawn(self, task: Any, /, *args: Any, key: str | None = None, **kwargs: Any) -> int:
        """Enqueue a child job of ``task`` (a registered task, or ``task.options(...)``) with
        these arguments, once: its id, for ``ctx.wait``.

        The child's id is recorded as the durable step ``spawn-1``, ``spawn-2``... (in
        the order the handler spawns), and the child is enqueued under ``key``, by
        default ``spawn:<this job's id>:<number>``, unique forever: a replay returns
        the same child, and a crash between the enqueue and the step finds the child
        by its key instead of enqueueing another.
        """
        if not callable(getattr(task, "options", None)):
            raise Fail(
                f"ctx.spawn: give a task (from @app.task, or task.options(...)), got {task!r}"
            )
        self._spawns += 1
        step = f"spawn-{self._spawns}"
        recorded = self._step_begin(step)
        if recorded is not None:
            return int(recorded.result)
        child_key = key if key is not None else f"spawn:{self.job.id}:{self._spawns}"
        headers = {SPAWNED_BY: str(self.job.id)}
        child = task.options(key=child_key, unique="forever", headers=headers).enqueue(
            *args, **kwargs
        )
        return int(self._step_end(step, child.id, utcnow()))

    def wait(self, children: Any, *, step: str | None = None) -> list[Any]:
        """The results of ``children`` (ids from ``ctx.spawn``, or jobs), in their order, once
        every one has ended; until then the job is parked (as ``ctx.sleep`` parks it)
        and looks again now and then: after a second, then less often as the wait
        grows long, at most every ``CHILDREN_POLL_MAX`` seconds.

        Raises ``ChildFailed`` when some failed or were cancelled (their errors and
        the others' results on it). Which children ended how is recorded as the
        durable step ``wait-1``, ``wait-2``... (or ``step``). Raises ``Parked`` to
        park: let it through.
        """
        ids = _child_ids(children)
        self._child_waits += 1
        step_name = step if step is not None else f"wait-{self._child_waits}"
        recorded = self._step_begin(step_name)
        if recorded is None:
            if self._hooks is None:
                raise ConfigurationError(
                    "ctx.wait needs a job run by a worker, by App(inline=True) or by "
                    "conveyor.testing.drain: this Context was made by hand"
                )
            self._park_until_ended(step_name, ids)
            ended = {job.id: job for job in self._hooks.jobs(ids)}
            outcome = {
                str(i): [str(ended[i].state), ended[i].error] if i in ended else ["deleted", None]
                for i in ids
            }
            self._step_end(step_name, outcome, utcnow())
            recorded = self._steps[step_name] if self._steps is not None else None
            assert recorded is not None
        return self._children_results(ids, recorded.result)

    def _park_until_ended(self, step: str, ids: list[int]) -> None:
        """Return once every child has ended; else park the job (raises ``Parked``)."""
        assert self._hooks is not None
        now = utcnow()
        newest = max((job.created_at for job in self._hooks.jobs(ids)), default=now)
        # A quarter of the time waited so far: soon for short children, seldom for long ones.
        seconds = min(max((now - newest).total_seconds() / 4, 1.0), CHILDREN_POLL_MAX)
        until = now + timedelta(seconds=seconds)
        parked = self._hooks.park_children(self.job, step, ids, until)
        if parked is None:
            raise LeaseLostError(
                f"job {self.job.id}: its lease was lost (another worker may run it now) "
                "while it waited for its children"
            )
        if parked == "parked":
            self.parked = True
            raise Parked(until, seconds, f"{len(ids)} child job(s)")

    def _children_results(self, ids: list[int], outcome: dict[str, Any]) -> list[Any]:
        """The children's results in order; ``ChildFailed`` when some did not succeed."""
        assert self._hooks is not None
        found = {job.id: job for job in self._hooks.jobs(ids)}
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        for i in ids:
            state, error = outcome[str(i)]
            if state == JobState.SUCCEEDED and i in found:
                results[i] = found[i].result
            elif state == JobState.SUCCEEDED:
                errors[i] = f"job {i} succeeded but was deleted since: its result is gone"
            else:
                errors[i] = error or state
        if errors:
            raise ChildFailed(self.job.id, errors, results)
        return [results[i] for i in ids]

    def complete(self, connection: Any, result: Any = None) -> None:
        """Record this job's success in ``connection``'s open transaction, with your writes.

        ``connection`` is a connection to the queue's own database with an open
        transaction (a psycopg Connection on PostgreSQL, a sqlite3 Connection on
        SQLite). Commit it, and your writes and the job's success are durable
        together; roll it back, and neither is (the handler's outcome is then
        recorded as usual). Fenced by the attempt's lease: when the attempt no
        longer holds the job, raises ``LeaseLostError`` and writes nothing, so
        that your transaction rolls back. Call it last, just before the commit:
        the job's row stays locked until then. What the handler returns
        afterwards is not recorded.
        """
        try:
            result_json = encode_json("the result given to ctx.complete", result)
        except InvalidJobError as exc:
            raise Fail(str(exc)) from None
        if self._hooks is None:
            raise ConfigurationError(
                "ctx.complete needs a job run by a worker, by App(inline=True) or by "
                "conveyor.testing.drain: this Context was made by hand"
            )
        if not self._hooks.complete_in(self.job, connection, result_json):
            raise LeaseLostError(
                f"job {self.job.id}: its lease was lost (another worker may run it now); "
                "its success was not written: roll your transaction back"
            )
        self.completed_in_transaction = True


def _child_ids(children: Any) -> list[int]:
    """The ids ``ctx.wait`` was given: one or many, each an id (``ctx.spawn``) or a Job."""
    if isinstance(children, int | Job):
        children = [children]
    ids = []
    for child in children if isinstance(children, list | tuple) else [children]:
        if isinstance(child, Job):
            ids.append(child.id)
        elif isinstance(child, int) and not isinstance(child, bool):
            ids.append(child)
        else:
            raise Fail(f"ctx.wait: give child job ids (from ctx.spawn) or jobs, got {child!r}")
    return ids


def _moment_text(value: Any) -> str:
    """A recorded moment as ISO text: the SQL stores record ISO text, Redis epoch seconds."""
    try:
        return datetime.fromtimestamp(float(value), UTC).isoformat()
    except (TypeError, ValueError):
        return str(value)


def wake_time(
    now: datetime, duration: float | timedelta | datetime, what: str = "ctx.sleep"
) -> datetime:
    """When a sleep (or a wait: ``what``) of ``duration`` (seconds, a timedelta, or an
    aware datetime) ends."""
    if isinstance(duration, datetime):
        if duration.tzinfo is None:
            raise Fail(f"{what}: give an aware datetime (with its time zone), or seconds")
        return max(now, duration.astimezone(UTC))
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise Fail(f"{what}: give seconds, a timedelta or a datetime, got {duration!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_SLEEP.total_seconds():
        raise Fail(f"{what}: {duration!r} is not from 0 to {MAX_SLEEP.days:,} days")
    return now + timedelta(seconds=seconds)
