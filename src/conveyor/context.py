"""What a handler sees of its job: ids, progress, the cancel signal, a manual heartbeat."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from conveyor.errors import Retry, StoreUnavailableError
from conveyor.job import Job, JobState, storable_text
from conveyor.limits import throttle_seconds
from conveyor.logs import job_fields
from conveyor.pacing import DutyBackoff

log = logging.getLogger("conveyor.worker")
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

    def parents(self, job: Job) -> list[Job]:
        """The jobs ``job`` waited for (``after=``), as stored now."""
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
    _parents: list[Job] | None = field(default=None, repr=False)

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def parents(self) -> list[Job]:
        """The jobs this one waited for (enqueued with ``after=``), read once, by id."""
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
        """The errors of the jobs this one waited for that failed or were cancelled, by id."""
        return {
            p.id: p.error or str(p.state)
            for p in self.parents
            if p.state in (JobState.FAILED, JobState.CANCELLED)
        }

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
