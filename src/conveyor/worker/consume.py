"""The pull API: claim jobs one at a time in a loop the caller owns.

For code that must own its loop, such as a conversation that consumes its own
messages strictly in order (``group=``). While the caller holds a job, a
background thread renews its lease; when nothing is ready, the iterator waits
for the same wakeups as a worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Generator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from conveyor.errors import LeaseLostError
from conveyor.job import Job, encode_json, utcnow
from conveyor.store.base import Completion, Failure, Lease
from conveyor.worker.wakeup import Wakeup

if TYPE_CHECKING:
    from conveyor.app import App

log = logging.getLogger("conveyor.consume")


class ConsumedJob:
    """A job claimed by ``consume``: end it with complete, fail or release (or ``with``)."""

    def __init__(self, app: App, job: Job, lease: timedelta) -> None:
        self.app = app
        self.job = job
        self._lease = lease
        self.ended = False
        self._stop_beat = threading.Event()
        self._beat = threading.Thread(target=self._keep_lease, daemon=True)
        self._beat.start()

    def __getattr__(self, name: str) -> Any:  # id, args, kwargs, attempts...: the Job's
        return getattr(self.job, name)

    def __repr__(self) -> str:
        return f"<ConsumedJob {self.job.id} {self.job.task}>"

    @property
    def lease(self) -> Lease:
        assert self.job.lease_token is not None
        return Lease(self.job.id, self.job.lease_token)

    def _keep_lease(self) -> None:
        interval = self._lease.total_seconds() / 3
        while not self._stop_beat.wait(interval):
            try:
                if not self.app.store.job_heartbeat([self.lease], self._lease, utcnow()):
                    log.warning("job %s: lease lost while held by a consumer", self.job.id)
                    return
            except Exception:
                log.exception("job %s: heartbeat failed; retrying", self.job.id)

    def _end(self, changed: list[int], what: str) -> None:
        self.ended = True
        self._stop_beat.set()
        if self.job.id not in changed:
            raise LeaseLostError(
                f"job {self.job.id}: the lease was lost before it could be {what}; "
                "another worker may have taken it over"
            )
        self.app.changes.publish("done", str(self.job.id))

    def complete(self, result: Any = None) -> None:
        completion = Completion(self.job.id, self.lease.token, encode_json("result", result))
        self._end(self.app.store.job_complete([completion], utcnow()), "completed")

    def fail(self, error: str | BaseException, retry_in: float | None = None) -> None:
        """Fail this attempt: retried after ``retry_in`` seconds (the task's backoff if None)."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        task = self.app.tasks.get(self.job.task)
        if retry_in is None:
            retry_in = task.backoff.delay(self.job.attempts) if task else 0.0
        now = utcnow()
        failure = Failure(self.job.id, self.lease.token, text, now + timedelta(seconds=retry_in))
        self._end(self.app.store.job_fail([failure], now), "failed")

    def release(self) -> None:
        """Hand the job back to the queue without using up an attempt."""
        self._end(self.app.store.job_release([self.lease], utcnow()), "released")

    def __enter__(self) -> ConsumedJob:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.ended:
            return
        if exc is None:
            self.complete()
        else:
            self.fail(exc)


def consume(
    app: App,
    queues: Sequence[str],
    group: str | None = None,
    lease: float = 30.0,
    poll_interval: float = 1.0,
    *,
    stop: threading.Event | None = None,
    wake: Wakeup | None = None,
) -> Generator[ConsumedJob, None, None]:
    """Claim and yield jobs until closed, or until ``stop`` is set (pull ``wake`` to be quick)."""
    worker_id = f"{socket.gethostname()}:{os.getpid()}:consume-{uuid.uuid4().hex[:8]}"
    lease_delta = timedelta(seconds=lease)
    wake = wake if wake is not None else Wakeup()

    def listener(channel: str, payload: str) -> None:
        if channel in ("jobs", "any", "reconnected", "done"):
            wake.set(channel)

    app.changes.add(listener)
    held: ConsumedJob | None = None
    try:
        while stop is None or not stop.is_set():
            claimed = app.store.job_claim(queues, 1, worker_id, lease_delta, utcnow(), group=group)
            if not claimed:
                next_at = app.store.next_run_at(queues)
                pause = poll_interval
                if next_at is not None:
                    pause = max(0.0, min(pause, (next_at - utcnow()).total_seconds()))
                wake.wait(pause)
                continue
            claimed[0]._app = app
            held = ConsumedJob(app, claimed[0], lease_delta)
            yield held
            if not held.ended:
                # The loop body moved on without ending the job: hand it back.
                held.release()
            held = None
    finally:
        app.changes.remove(listener)
        if held is not None and not held.ended:
            with contextlib.suppress(LeaseLostError):
                held.release()


async def aconsume(
    app: App,
    queues: Sequence[str],
    group: str | None = None,
    lease: float = 30.0,
    poll_interval: float = 1.0,
) -> AsyncIterator[ConsumedJob]:
    """The async twin: the blocking claims and waits run in a thread."""
    stop = threading.Event()
    wake = Wakeup()
    iterator = consume(
        app, queues, group=group, lease=lease, poll_interval=poll_interval, stop=stop, wake=wake
    )
    sentinel = object()
    stepping = threading.Lock()

    def step() -> object:
        with stepping:
            return next(iterator, sentinel)

    def close() -> None:
        with stepping:
            iterator.close()

    try:
        while True:
            job = await asyncio.to_thread(step)
            if job is sentinel:
                return
            assert isinstance(job, ConsumedJob)
            yield job
    finally:
        # Cancelled mid-wait, a step still runs in its thread (and would wait for a job
        # forever, holding up the event loop's shutdown): stop it, then close the
        # iterator, which releases a job the step claimed meanwhile.
        stop.set()
        wake.set("stop")
        await asyncio.to_thread(close)
