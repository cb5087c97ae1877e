"""The pull API: claim jobs (one at a time, or a batch) in a loop the caller owns.

For code that must own its loop, such as a conversation that consumes its own
messages strictly in order (``group=``). While the caller holds a job, the
worker's lease keeper (one thread per consumer, not one per job) renews its
lease and learns of cancel requests, which ``job.cancelled`` shows; when
nothing is ready, the loop waits for the same wake-ups as a worker. Outcomes
are recorded by the same completer as the worker's.

As robust as a worker: every consumer takes back, on a timer, busy or idle,
the jobs of consumers (or workers) whose lease expired, so a consume-only
service needs no Worker for that; database errors are retried with the
backoff every duty uses; ``stop()`` ends the loop from another thread; ``idle_timeout`` ends
it after a quiet spell; ``app.close()`` releases what it holds; a job whose
payload cannot be decoded fails at once instead of being handed out.

An exception leaving ``with job:`` is judged by the worker's rule for a
handler's: ``Fail`` fails the job for good, ``Retry`` runs it again later
without using up an attempt, anything else is a failed attempt (retried while
attempts remain). ``batch_size`` claims several jobs in one call; each is
renewed and ended under its own lease, and those not yet handed out go back
when the loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any

from conveyor.changes import ids_payload
from conveyor.context import CancelSignal, Context
from conveyor.errors import (
    ConfigurationError,
    Fail,
    LeaseLostError,
    Retry,
    StoreUnavailableError,
)
from conveyor.job import Job, JobState, encode_json, utcnow
from conveyor.limits import throttle_seconds
from conveyor.logs import job_fields
from conveyor.middleware import Attempt, Middleware, run_after, run_before
from conveyor.pacing import DutyBackoff
from conveyor.store.records import Lease, LeaseStatus
from conveyor.worker.completer import Completer
from conveyor.worker.executor import (
    PAYLOAD_ERRORS,
    Outcome,
    Running,
    outcome_name,
    run_again_at,
    undecodable,
)
from conveyor.worker.hooks import throttle_job
from conveyor.worker.leases import LeaseKeeper
from conveyor.worker.maintenance import Rescuer
from conveyor.worker.runtime import Runtime
from conveyor.worker.wakeup import Wakeup

log = logging.getLogger("conveyor.consume")

#: The most jobs one claim of ``consume`` takes.
MAX_BATCH_SIZE = 1000
#: A batch's waiting jobs are confirmed still held (one renewal of them all) before
#: the next is handed out when this many seconds passed since the last confirmation,
#: or sooner when a change was heard that may have taken one back.
CONFIRM_AFTER = 1.0


@dataclass(frozen=True, slots=True)
class ConsumeOptions:
    """How a consume loop paces itself (see ``App.consume``)."""

    lease: float = 30.0
    #: Longest sleep without looking for work when no wake-up comes.
    poll_interval: float = 1.0
    idle_timeout: float | None = None
    #: Jobs claimed at once; each is held under its own lease until handed out and ended.
    batch_size: int = 1
    #: After a store error, the loop waits ``backoff_first`` seconds, doubling up to
    #: ``backoff_max``, before it claims again.
    backoff_first: float = 0.05
    backoff_max: float = 2.0

    def __post_init__(self) -> None:
        for name in ("lease", "poll_interval", "backoff_first", "backoff_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"consume: {name} must be a positive number of seconds")
        if self.backoff_first > self.backoff_max:
            raise ConfigurationError("consume: backoff_first must not exceed backoff_max")
        if self.idle_timeout is not None and not self.idle_timeout >= 0:
            raise ConfigurationError("consume: idle_timeout must be 0 or more seconds (or None)")
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ConfigurationError(
                f"consume: batch_size must be a whole number from 1 to {MAX_BATCH_SIZE}"
            )


class ConsumedJob:
    """A job claimed by ``consume``: end it with complete, fail or release (or ``with``).

    ``job.cancelled`` is set when its cancel is requested or its lease is lost;
    leaving a ``with`` block after a cancel request ends the job cancelled.
    """

    def __init__(self, runtime: Runtime, job: Job, lease: timedelta) -> None:
        self.runtime = runtime
        self.job = job
        self._lease = lease
        self.ended = False
        #: What the lease keeper renews while the job is held.
        self.running = Running(job=job, task=runtime.tasks.get(job.task), context=Context(job))
        #: The attempt the middleware sees, from the hand-out (``_begin``) to the end.
        self._attempt: Attempt | None = None
        self._entered: list[Middleware] = []

    def _begin(self) -> None:
        """The hand-out: the middleware's before-hooks, in the thread that takes the job."""
        chain = self.runtime.middleware()
        if chain:
            self._attempt = Attempt(self.job, self.running.context)
            self._entered = run_before(chain, "before_attempt", self._attempt)

    def _tell_middleware(
        self, outcome: Outcome, result: Any, exception: BaseException | None
    ) -> None:
        """The middleware's after-hooks, once, before the outcome is recorded."""
        attempt, self._attempt = self._attempt, None
        if attempt is None:
            return
        attempt.outcome = outcome_name(self.job, outcome)
        attempt.result = result if outcome.kind == "complete" else None
        attempt.exception = exception
        attempt.error = outcome.error
        run_after(self._entered, "after_attempt", (attempt,))

    @property
    def cancelled(self) -> CancelSignal:
        """Set when the job should stop: its cancel was requested, or its lease was lost.

        ``reason`` says which ("cancel" or "lease lost"). Check it between steps;
        a job whose cancel was requested ends cancelled whatever it is ended
        with, unless it is completed.
        """
        return self.running.context.cancelled

    def __getattr__(self, name: str) -> Any:  # id, args, kwargs, attempts...: the Job's
        return getattr(self.job, name)

    def __repr__(self) -> str:
        return f"<ConsumedJob {self.job.id} {self.job.task}>"

    @property
    def lease(self) -> Lease:
        assert self.job.lease_token is not None
        return Lease(self.job.id, self.job.lease_token)

    def _end(
        self,
        outcome: Outcome,
        what: str,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        """Record the outcome, retrying while the database is away (for up to one lease)."""
        self._tell_middleware(outcome, result, exception)
        completer = Completer(self.runtime.store, self.runtime.changes, self.runtime.codec)
        give_up = time.monotonic() + self._lease.total_seconds()
        backoff = DutyBackoff(f"job {self.job.id}: recording its outcome", log, ceiling=2.0)
        while True:
            try:
                written = completer.record([(self.running, outcome)])
                break
            except StoreUnavailableError as exc:
                pause = backoff.failed(exc)
                if time.monotonic() + pause >= give_up:
                    self.ended = True  # the keeper stops renewing: the lease runs out
                    raise
                time.sleep(pause)
        self.ended = True
        if self.job.id not in written:
            raise LeaseLostError(
                f"job {self.job.id}: the lease was lost before it could be {what}; "
                "another worker may have taken it over"
            )

    @property
    def upstream(self) -> dict[int, Any]:
        """The results of the jobs this one waited for (``after=``) that succeeded, by id."""
        edges = self.runtime.parent_edges(self.job.id)
        parents = [edge.job for edge in edges if edge.job is not None]
        return {p.id: p.result for p in parents if p.state == JobState.SUCCEEDED}

    def complete(self, result: Any = None) -> None:
        self._end(
            Outcome("complete", result_json=encode_json("result", result)), "completed", result
        )

    def fail(
        self, error: str | BaseException, retry_in: float | None = None, *, final: bool = False
    ) -> None:
        """Fail this attempt: retried after ``retry_in`` seconds (the task's backoff if None).

        ``final=True``, or a ``Fail`` exception as ``error``, fails the job for
        good: no further attempt, whatever attempts remain (as ``raise Fail`` in
        a worker's handler).
        """
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        exception = error if isinstance(error, BaseException) else None
        if final or isinstance(error, Fail):
            self._end(Outcome("fail", error=text), "failed", None, exception)
            return
        task = self.runtime.tasks.get(self.job.task)
        if retry_in is None:
            retry_in = task.backoff.delay(self.job.attempts) if task else 0.0
        run_at = run_again_at(utcnow(), retry_in, "retry_in")
        self._end(Outcome("retry", error=text, run_at=run_at), "failed", None, exception)

    def fail_for_good(self, error: str | BaseException) -> None:
        """Fail the job with no further attempt: ``fail(error, final=True)``."""
        self.fail(error, final=True)

    def retry_later(self, delay: float | timedelta = 0.0, exception: Retry | None = None) -> None:
        """Queue the job again after ``delay`` without using up an attempt (``raise Retry``)."""
        run_at = run_again_at(utcnow(), delay, "Retry delay")
        self._end(Outcome("snooze", run_at=run_at), "snoozed", None, exception)

    def release(self) -> None:
        """Hand the job back to the queue without using up an attempt."""
        self._end(Outcome("release"), "released")

    def throttle(self, seconds: float | timedelta, *, whole_queue: bool = False) -> None:
        """Hold this job's limit key (or queue) back for every worker; then release or fail it.

        As ``ctx.throttle`` in a handler: for a partner that said "too many
        requests". The job itself is still held: ``job.release()`` hands it back.
        """
        throttle_job(self.runtime, self.job, throttle_seconds(seconds), whole_queue)

    def __enter__(self) -> ConsumedJob:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """End the job by how the block ended; ``Fail`` and ``Retry`` are handled, not raised.

        Any other exception is recorded as a failed attempt and goes on up.
        """
        if self.ended:
            return False
        if self.cancelled.reason == "cancel":
            # As a worker does for a handler it asked to stop: whatever the body
            # did after the request, the job ends cancelled.
            self._end(Outcome("cancelled"), "cancelled", None, exc)
        elif exc is None:
            self.complete()
        elif isinstance(exc, Retry):
            self.retry_later(exc.delay, exc)
            return True
        elif isinstance(exc, Fail):
            self.fail(exc)  # for good, as in a worker's handler
            return True
        else:
            self.fail(exc)
        return False


class Consumer:
    """The iterator ``app.consume`` returns: ``for job in consumer``; ``stop()`` from anywhere.

    Dropping it (leaving the ``for`` loop) releases a job still held, as does
    ``close()``.
    """

    def __init__(
        self,
        runtime: Runtime,
        queues: Sequence[str],
        group: str | None = None,
        options: ConsumeOptions | None = None,
    ) -> None:
        if not queues:
            raise ConfigurationError("consume needs at least one queue")
        # The loop's state lives apart from this object, so that nothing but this
        # object holds the generator: dropping it closes the generator at once
        # (and releases what it holds), without waiting for the cycle collector.
        self._loop = _Loop(runtime, list(queues), group, options or ConsumeOptions())
        self._jobs = self._loop.run()
        runtime.consumers.add(self)

    @property
    def held(self) -> ConsumedJob | None:
        return self._loop.held

    def __iter__(self) -> Iterator[ConsumedJob]:
        return self

    def __next__(self) -> ConsumedJob:
        job = next(self._jobs)
        job._begin()
        return job

    def stop(self) -> None:
        """End the loop (from any thread): the iteration stops at its next step."""
        self._loop.stop()

    def close(self) -> None:
        """Stop, and release a job still held (and those of its batch not yet handed out)."""
        self._loop.stop()
        # Iterated in another thread right now (ValueError): stop() ends it there.
        with contextlib.suppress(ValueError):
            self._jobs.close()
        self._loop.release_held()


class _Loop:
    def __init__(
        self, runtime: Runtime, queues: list[str], group: str | None, options: ConsumeOptions
    ) -> None:
        self.runtime = runtime
        self.queues = queues
        self.group = group
        self.options = options
        self.lease = timedelta(seconds=options.lease)
        self.poll_interval = options.poll_interval
        self.idle_timeout = options.idle_timeout
        self.id = f"{socket.gethostname()}:{os.getpid()}:consume-{uuid.uuid4().hex[:8]}"
        self.held: ConsumedJob | None = None
        #: Jobs of the last claim not yet handed out: held, renewed, released at the end.
        self.waiting: list[ConsumedJob] = []
        self._waiting_lock = threading.Lock()
        #: When the waiting jobs' leases were last known to hold (monotonic; the claim
        #: or _confirm_waiting), and whether a change heard since may have voided one.
        self._confirmed_at = 0.0
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._wake = Wakeup()
        self._keeper: LeaseKeeper | None = None
        self._rescuer: Rescuer | None = None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set("stop")

    def _held_now(self) -> Sequence[Running]:
        held = self.held
        with self._waiting_lock:
            jobs = [held, *self.waiting] if held is not None else list(self.waiting)
        return [job.running for job in jobs if not job.ended]

    def _renewed(self, renewed: Sequence[Running], statuses: dict[int, LeaseStatus]) -> None:
        """From the lease keeper's thread: a lost lease or a cancel request reaches the job."""
        held = self.held
        with self._waiting_lock:
            mine = {job.running.id: job for job in self.waiting}
        if held is not None:
            mine[held.running.id] = held
        for running in renewed:
            job = mine.get(running.id)
            if job is None or job.running is not running or job.ended:
                continue  # ended while the renewal was on its way: nothing was lost
            status = statuses.get(running.id)
            if status is None:
                if not running.context.cancelled:
                    log.warning(
                        "job %s: lease lost while held by a consumer",
                        running.id,
                        extra=job_fields(running.job),
                    )
                running.context.cancelled.set("lease lost")
                running.abort = "lease lost"  # renewed no more
            elif status.cancel_requested:
                running.context.cancelled.set("cancel")

    def _start_threads(self) -> None:
        if self._keeper is None:
            self._keeper = LeaseKeeper(
                self.runtime.store, self.id, self.lease.total_seconds(), self._held_now,
                self._renewed, check_in=False,
            )  # fmt: skip
            self._keeper.start()
        if self._rescuer is None:
            self._rescuer = Rescuer(
                self.runtime, self.lease.total_seconds(), self._rescued, holder=self.id
            )
            self._rescuer.start()

    def _stop_threads(self) -> None:
        for thread in (self._keeper, self._rescuer):
            if thread is not None:
                thread.stop()
        self._keeper = self._rescuer = None

    def _rescued(self) -> None:
        self._wake.set("rescued")  # a rescued job may be ours to take

    def release_held(self) -> None:
        with self._waiting_lock:
            waiting, self.waiting = self.waiting, []
        held, self.held = self.held, None
        for job in [held, *waiting]:
            self._release(job)

    def _release(self, held: ConsumedJob | None) -> None:
        if held is not None and not held.ended:
            try:
                held.release()
            except (LeaseLostError, StoreUnavailableError) as exc:
                log.warning(
                    "job %s: could not release it (%s); its lease will expire",
                    held.id,
                    exc,
                    extra=job_fields(held.job),
                )

    def _listener(self, channel: str, payload: str) -> None:
        if channel in ("jobs", "any", "reconnected", "cancel"):
            # A take-back requeues its jobs ("jobs"), as other changes may: the
            # next hand-out from the batch confirms the waiting leases first.
            self._changed.set()
        if channel in ("jobs", "any", "reconnected", "done"):
            self._wake.set(channel)
        keeper = self._keeper
        if keeper is None or channel not in ("cancel", "any", "reconnected"):
            return
        held = self.held
        if channel == "reconnected":
            keeper.renew_soon()  # notices were lost meanwhile: the renewal tells all
        elif channel == "any":
            # Something was committed, maybe by our own renewal: a read looks for
            # cancels. A renewal here would be a commit that is heard again.
            if held is not None or self.waiting:
                keeper.check_soon()
        else:
            ids, _, token = payload.partition(":")
            # app.cancel in this process names one job and its lease token.
            if token and held is not None and ids == str(held.job.id):
                if token == held.job.lease_token:
                    held.cancelled.set("cancel")
                return
            if self._holds_any(ids.split(",")):
                keeper.check_soon()

    def _holds_any(self, ids: Sequence[str]) -> bool:
        """Whether a cancel notice names a job this loop holds (handed out or waiting)."""
        held = self.held
        with self._waiting_lock:
            mine = {str(job.job.id) for job in self.waiting}
        if held is not None:
            mine.add(str(held.job.id))
        return not mine.isdisjoint(ids)

    def run(self) -> Generator[ConsumedJob, None, None]:
        self.runtime.changes.add(self._listener)
        self._start_threads()
        idle_since = time.monotonic()
        backoff = DutyBackoff(
            "consume: claiming",
            log,
            first=self.options.backoff_first,
            ceiling=self.options.backoff_max,
        )
        try:
            while not self._stop.is_set():
                job = self._next_waiting()
                if job is None:
                    try:
                        self._changed.clear()  # the claim itself confirms what it takes
                        self._confirmed_at = time.monotonic()
                        claimed = self._claim()
                        backoff.succeeded()
                    except StoreUnavailableError as exc:
                        # Only a stop cuts the pause short: a change heard meanwhile (a
                        # rescue, another process's write) says nothing of the store's
                        # health, and answering each one would undo the backoff.
                        self._stop.wait(backoff.failed(exc))
                        continue
                    if not claimed:
                        idle = time.monotonic() - idle_since
                        if self.idle_timeout is not None and idle >= self.idle_timeout:
                            return
                        self._wait_for_work(idle_since)
                        continue
                    with self._waiting_lock:
                        self.waiting = [ConsumedJob(self.runtime, j, self.lease) for j in claimed]
                    if self._stop.is_set():
                        continue  # the loop ends: release_held gives the batch back
                    # The claim confirms the first: one job a claim costs no more.
                    job = self._next_waiting(confirmed=True)
                    if job is None:
                        continue
                self.held = job
                yield job
                # A job the loop body moved on from without ending it goes back.
                held, self.held = self.held, None
                self._release(held)
                idle_since = time.monotonic()
        finally:
            self.runtime.changes.remove(self._listener)
            self.release_held()
            self._stop_threads()

    def _next_waiting(self, confirmed: bool = False) -> ConsumedJob | None:
        """The next job of the last claim still held (a lost lease drops it unhanded)."""
        with self._waiting_lock:
            waiting = list(self.waiting)
        if (
            waiting
            and not confirmed
            and (self._changed.is_set() or time.monotonic() - self._confirmed_at > CONFIRM_AFTER)
        ):
            self._confirm_waiting(waiting)
        with self._waiting_lock:
            while self.waiting:
                job = self.waiting.pop(0)
                if job.cancelled.reason != "lease lost":
                    return job
        return None

    def _confirm_waiting(self, waiting: list[ConsumedJob]) -> None:
        """Renew the waiting jobs' leases now, in one call: those lost are not handed out.

        The lease keeper renews them too, but only every third of the lease; an
        operator's take-back in between would otherwise hand out a job whose
        lease is void (its outcome refused, the job run twice). Costs one call per
        hand-out at most, and with a steady flow one a second.
        """
        self._changed.clear()  # before the call: a change heard during it counts next time
        started = time.monotonic()
        running = [job.running for job in waiting if not job.ended]
        try:
            statuses = self.runtime.store.job_heartbeat(
                [Lease(r.id, r.token) for r in running], self.lease
            )
        except StoreUnavailableError:
            self._changed.set()  # not confirmed: the hand-out goes on, the next one asks again
            return
        self._confirmed_at = started
        self._renewed(running, {status.id: status for status in statuses})

    def _claim(self) -> list[Job]:
        """Claim up to a batch; jobs that can never run fail at once and are left out."""
        store = self.runtime.store
        size = self.options.batch_size
        while True:
            claimed = store.job_claim(self.queues, size, self.id, self.lease, group=self.group)
            if claimed:
                self.runtime.changes.publish("claimed", ids_payload(claimed))
            good: list[Job] = []
            for job in claimed:
                self.runtime.attach(job)
                poison = _payload_check(job)
                if poison is None:
                    good.append(job)
                    continue
                # Never handed out: it would fail the same way every time, and block its group.
                log.error("job %s failed at once: %s", job.id, poison.error, extra=job_fields(job))
                running = Running(job=job, task=None, context=Context(job))
                Completer(store, self.runtime.changes, self.runtime.codec).record(
                    [(running, poison)]
                )
            if good or not claimed:
                return good

    def _wait_for_work(self, idle_since: float) -> None:
        store = self.runtime.store
        now = time.monotonic()
        pause = self.poll_interval
        try:
            next_in = store.next_run_in(self.queues, group=self.group)
        except Exception:
            next_in = None
        if next_in is not None:
            pause = min(pause, next_in)
        if self.idle_timeout is not None:
            pause = min(pause, max(0.0, idle_since + self.idle_timeout - now))
        self._wake.wait(max(pause, 0.001))


def _payload_check(job: Job) -> Outcome | None:
    try:
        job.args, job.kwargs  # noqa: B018 - decoding is the check
    except PAYLOAD_ERRORS as exc:
        return undecodable(exc)
    return None


async def aconsume(
    runtime: Runtime,
    queues: Sequence[str],
    group: str | None = None,
    options: ConsumeOptions | None = None,
) -> AsyncIterator[ConsumedJob]:
    """The async twin: the blocking claims and waits run in a thread."""
    consumer = Consumer(runtime, queues, group, options)
    sentinel = object()
    stepping = threading.Lock()

    def step() -> object:
        with stepping:
            # The loop itself: the hand-out's hooks run below, in the caller's task.
            return next(consumer._jobs, sentinel)

    def close() -> None:
        with stepping:
            consumer.close()

    try:
        while True:
            job = await asyncio.to_thread(step)
            if job is sentinel:
                return
            assert isinstance(job, ConsumedJob)
            job._begin()
            yield job
    finally:
        # Cancelled mid-wait, a step still runs in its thread (and would wait for a job
        # forever, holding up the event loop's shutdown): stop it, then close the
        # consumer, which releases a job the step claimed meanwhile.
        consumer.stop()
        await asyncio.to_thread(close)
