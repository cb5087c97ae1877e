"""The worker: claims jobs, runs their handlers, records outcomes, holds leases, drains.

One control thread does all store writes of the worker's jobs, in batches:
claims fill every free slot in one statement, outcomes are acknowledged
together as soon as the loop wakes, and every held lease is renewed in one
statement each third of the lease. Handlers run in a thread pool (``def``) or
on an event loop the worker owns (``async def``), and report back through a
queue; the loop sleeps on a latch that anything worth a look pulls: a local
enqueue, a notification from the database, a finished handler, a timer for the
next deferred job, or the fallback poll.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from conveyor.job import utcnow
from conveyor.store.base import Completion, Failure, Lease, Snooze
from conveyor.worker.acks import RETRY_PAUSE, Acknowledger
from conveyor.worker.context import Context
from conveyor.worker.execution import (
    EventLoopThread,
    Outcome,
    Running,
    poison_outcome,
)
from conveyor.worker.handler_threads import HandlerThreads
from conveyor.worker.wakeup import Wakeup

if TYPE_CHECKING:
    from conveyor.app import App

log = logging.getLogger("conveyor.worker")


@dataclass(frozen=True)
class WorkerOptions:
    queues: tuple[str, ...]
    concurrency: int = 8
    burst: bool = False
    stop_timeout: float = 30.0
    lease: float = 30.0
    #: Longest sleep without a wake: a missed signal delays work by at most this.
    poll_interval: float = 1.0
    #: Run the rescuer, retention and periodic tasks (one leader at a time).
    maintenance: bool = True


class Worker:
    """Runs an App's jobs. ``run()`` blocks; ``start()``/``stop()`` or ``with`` use a thread."""

    def __init__(
        self,
        app: App,
        queues: Sequence[str] | None = None,
        concurrency: int = 8,
        burst: bool = False,
        stop_timeout: float = 30.0,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        maintenance: bool = True,
        name: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease <= 0.1:
            raise ValueError("lease must be longer than 0.1 seconds")
        chosen = tuple(queues) if queues else tuple(sorted({t.queue for t in app.tasks.values()}))
        if not chosen:
            raise ValueError("no queues to work on: register tasks or pass queues=[...]")
        self.app = app
        self.store = app.store
        self.options = WorkerOptions(
            chosen, concurrency, burst, stop_timeout, lease, poll_interval, maintenance
        )
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lease = timedelta(seconds=lease)
        self._wake = Wakeup()
        self._in_hand: dict[int, Running] = {}
        self._finished: deque[Running] = deque()
        self._threads = HandlerThreads(concurrency)
        self._loop_thread: EventLoopThread | None = None
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._maybe_ready = True
        self._next_timer: datetime | None = None
        self._next_heartbeat = 0.0
        self._next_poll = 0.0
        self._next_cancel_check = 0.0
        #: A look for cancels was put off by the rate limit: take it when the pause ends.
        self._cancel_check_due = False
        self._drain_deadline: float | None = None
        self._acks = Acknowledger(self._store_outcomes, app.store.ping)
        self._maintenance: Any = None
        self.processed = 0

    # --- public control ---------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (or, in burst mode, until nothing is ready). Returns an exit code.

        In the main thread, SIGTERM and SIGINT start a graceful drain; a second
        SIGINT stops at once (still releasing held jobs).
        """
        restore = self._install_signal_handlers()
        try:
            self._work()
        finally:
            for signum, handler in restore.items():
                signal.signal(signum, handler)
        return 0

    def start(self) -> Worker:
        """Run in a background thread (for tests and embedding)."""
        self._thread = threading.Thread(target=self._work, name=f"conveyor-worker-{self.id}")
        self._thread.start()
        return self

    def stop(self, graceful: bool = True, timeout: float | None = None) -> None:
        """Stop claiming; with ``graceful`` let running jobs finish for up to stop_timeout."""
        self._stopping.set()
        if not graceful:
            self._hard_stop.set()
        self._wake.set("stop")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wake(self, reason: str = "wake") -> None:
        self._wake.set(reason)

    # --- signals ------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stopping.is_set() and signum == signal.SIGINT:
                log.warning("second interrupt: stopping now, releasing held jobs")
                self._hard_stop.set()
            else:
                log.info(
                    "%s: draining (up to %ss)",
                    signal.Signals(signum).name,
                    self.options.stop_timeout,
                )
            self._stopping.set()
            self._wake.set("signal")

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
        return previous

    # --- the control loop ------------------------------------------------------------

    def _work(self) -> None:
        from conveyor.maintenance import Maintenance

        try:
            self.app.changes.add(self._on_store_change)
            self.store.worker_register(
                self.id, socket.gethostname(), os.getpid(), list(self.options.queues),
                self.options.concurrency, utcnow(),
            )  # fmt: skip
            if self.options.maintenance:
                self._maintenance = Maintenance(self.app, self.id, self.options.lease)
                self._maintenance.start()
            self._loop()
        finally:
            self._shutdown()

    def _loop(self) -> None:
        while True:
            try:
                if self._step():
                    return
            except Exception:
                # The database is away (a restart, a failover, a locked file): held
                # jobs run on, their outcomes wait in the acknowledger, and a lease
                # that runs out meanwhile is rescued (its late outcome refused).
                # Look at everything again after a pause; the wakes it swallows are
                # covered by these flags.
                log.exception("worker loop: a store call failed; trying again in %ss", RETRY_PAUSE)
                self._maybe_ready = True
                self._cancel_check_due = True
                self._next_heartbeat = min(self._next_heartbeat, time.monotonic() + RETRY_PAUSE)
                self._wake.wait(RETRY_PAUSE)

    def _step(self) -> bool:
        """One round of the control loop; True when the worker may exit."""
        opts = self.options
        self._record_finished()
        now_mono = time.monotonic()
        if self._stopping.is_set():
            if self._drain_step(now_mono):
                return True
        else:
            claimed_any = self._claim_if_useful(now_mono)
            if opts.burst and not self._in_hand and not claimed_any and not self._finished:
                return True
        self._check_deadlines(now_mono)
        if now_mono >= self._next_heartbeat:
            self._heartbeat()
        reasons = self._wake.wait(self._sleep_time())
        if reasons & {"jobs", "any", "reconnected"} or not reasons:
            self._maybe_ready = True
        if reasons & {"cancel", "cancel-other", "any", "reconnected"} or self._cancel_check_due:
            self._check_cancels(force="cancel" in reasons or "reconnected" in reasons)
        return False

    def _sleep_time(self) -> float:
        now_mono = time.monotonic()
        until = min(self._next_heartbeat, self._next_poll) - now_mono
        if self._next_timer is not None:
            until = min(until, (self._next_timer - utcnow()).total_seconds())
        for running in self._in_hand.values():
            if running.deadline is not None and not running.settled:
                until = min(until, running.deadline - now_mono)
        if self._cancel_check_due:
            until = min(until, self._next_cancel_check - now_mono)
        if self._stopping.is_set():
            until = min(until, 0.05)
        return max(0.0, until)

    def _claim_if_useful(self, now_mono: float) -> bool:
        """Fill free slots when something may be ready; True if anything was claimed."""
        free = self.options.concurrency - len(self._in_hand)
        now = utcnow()
        if self._next_timer is not None and self._next_timer <= now:
            self._next_timer = None
            self._maybe_ready = True
        if now_mono >= self._next_poll:
            self._maybe_ready = True
            self._next_poll = now_mono + self.options.poll_interval
        if free <= 0 or not self._maybe_ready:
            return False
        jobs = self.store.job_claim(self.options.queues, free, self.id, self._lease, now)
        # A full claim means more may be waiting; a partial one means we got all there was.
        self._maybe_ready = len(jobs) == free
        # Dispatched before the next store call, which may fail: claimed jobs are held.
        for job in jobs:
            self._dispatch(job)
        if len(jobs) < free:
            self._next_timer = self.store.next_run_at(self.options.queues)
        return bool(jobs)

    def _dispatch(self, job: Any) -> None:
        task = self.app.tasks.get(job.task)
        running = Running(job=job, task=task, context=Context(job))
        running.context._progress = lambda fraction, message: self._progress(
            running, fraction, message
        )
        running.context._heartbeat = lambda: self._heartbeat_from_handler(running)
        self._in_hand[job.id] = running
        poison = poison_outcome(running)
        if poison is not None:
            running.outcome = poison
            self._finished.append(running)
            return
        assert task is not None
        if task.timeout is not None:
            running.deadline = running.started + task.timeout
        if task.is_async:
            if self._loop_thread is None:
                self._loop_thread = EventLoopThread()
            running.future = self._loop_thread.submit(running, self._handler_done)
        else:
            self._threads.submit(running, self._handler_done)

    def _handler_done(self, running: Running) -> None:
        """Called from a handler thread or the event loop: hand the outcome to the control loop."""
        self._finished.append(running)
        self._wake.set("done")

    # --- outcomes ------------------------------------------------------------------

    def _record_finished(self) -> None:
        """Write every finished handler's outcome, one store call per kind of outcome."""
        batch: list[Running] = []
        while self._finished:
            batch.append(self._finished.popleft())
        if not batch:
            return
        settle: list[tuple[Running, Outcome]] = []
        for running in batch:
            self._in_hand.pop(running.job.id, None)
            if running.settled or running.lost:
                continue  # recorded at its deadline or lost its lease: the late result is dropped
            outcome = running.outcome or Outcome("release")
            if running.abort == "cancel":
                outcome = Outcome("cancelled")
            elif running.abort == "shutdown" and outcome.kind != "complete":
                outcome = Outcome("release")
            settle.append((running, outcome))
        self._write_outcomes(settle)

    def _write_outcomes(self, settle: list[tuple[Running, Outcome]]) -> None:
        """Settle jobs here (in the control loop) and hand their outcomes to the writer."""
        for running, outcome in settle:
            running.settled = True
            if outcome.run_at is not None and (outcome.kind == "snooze" or outcome.retryable):
                self._set_timer(outcome.run_at)
        self._acks.submit(settle)

    def _store_outcomes(self, settle: list[tuple[Running, Outcome]]) -> None:
        """Write outcomes, one store call per kind (in the acknowledger's thread)."""
        now = utcnow()
        by_kind: dict[str, list[tuple[Running, Outcome]]] = {}
        for running, outcome in settle:
            by_kind.setdefault(outcome.kind, []).append((running, outcome))
        written: set[int] = set()
        for kind, items in by_kind.items():
            if kind == "complete":
                done = self.store.job_complete(
                    [Completion(r.job.id, r.token, o.result_json) for r, o in items], now
                )
            elif kind == "fail":
                failures = [
                    Failure(r.job.id, r.token, o.error or "failed", o.run_at or now, o.retryable)
                    for r, o in items
                ]
                done = self.store.job_fail(failures, now)
            elif kind == "snooze":
                snoozes = [Snooze(r.job.id, r.token, o.run_at or now) for r, o in items]
                done = self.store.job_snooze(snoozes, now)
            elif kind == "release":
                done = self.store.job_release([Lease(r.job.id, r.token) for r, _ in items], now)
            else:
                done = self.store.job_set_cancelled(
                    [Lease(r.job.id, r.token) for r, _ in items], now
                )
            written.update(done)
        if written:  # wakes waiters in this process
            self.app.changes.publish("done", ",".join(map(str, written)))
        for running, outcome in settle:
            if running.job.id not in written:
                log.warning(
                    "job %s: lease lost before its outcome (%s) was recorded; "
                    "another worker owns it now",
                    running.job.id,
                    outcome.kind,
                )
        self.processed += len(written)

    def _set_timer(self, when: datetime) -> None:
        if self._next_timer is None or when < self._next_timer:
            self._next_timer = when

    # --- leases, cancels, timeouts ------------------------------------------------------

    def _heartbeat(self) -> None:
        self._next_heartbeat = time.monotonic() + self.options.lease / 3
        self._renew([r for r in self._in_hand.values() if not r.settled and not r.lost])
        self.store.worker_beat(self.id, len(self._in_hand), utcnow())

    def _heartbeat_from_handler(self, running: Running) -> bool:
        """``ctx.heartbeat()``: renew one lease now; the control loop acts on what it learns."""
        statuses = self.store.job_heartbeat(
            [Lease(running.job.id, running.token)], self._lease, utcnow()
        )
        if not statuses or statuses[0].cancel_requested:
            self._wake.set("cancel")
        return bool(statuses)

    def _renew(self, held: list[Running]) -> bool:
        if not held:
            return True
        statuses = self.store.job_heartbeat(
            [Lease(r.job.id, r.token) for r in held], self._lease, utcnow()
        )
        alive = {s.id: s for s in statuses}
        for running in held:
            status = alive.get(running.job.id)
            if status is None:
                if not running.lost:
                    log.warning(
                        "job %s: lease lost (rescued or cancelled elsewhere)", running.job.id
                    )
                running.lost = True
                running.context.cancelled.set("lease lost")
            elif status.cancel_requested:
                self._abort(running, "cancel")
        return all(r.job.id in alive for r in held)

    def _check_cancels(self, force: bool) -> None:
        """Look for cancel requests of held jobs (quick path; the heartbeat is the fallback)."""
        now_mono = time.monotonic()
        if not self._in_hand:
            self._cancel_check_due = False
            return
        if not force and now_mono < self._next_cancel_check:
            # Put off, not dropped: the change that woke us may be the cancel itself.
            self._cancel_check_due = True
            return
        self._cancel_check_due = False
        self._next_cancel_check = now_mono + 0.05
        for job in self.store.job_get_many(list(self._in_hand)):
            running = self._in_hand.get(job.id)
            if running is not None and job.cancel_requested and job.lease_token == running.token:
                self._abort(running, "cancel")

    def _abort(self, running: Running, reason: str) -> None:
        if running.abort is not None:
            return
        running.abort = reason
        running.context.cancelled.set(reason)
        if running.async_task is not None and self._loop_thread is not None:
            self._loop_thread.cancel(running)
        if reason == "cancel" and not running.settled:
            # Record the cancel now: a sync handler cannot be interrupted and may
            # run on; its slot stays taken until it returns, its result is dropped.
            self._write_outcomes([(running, Outcome("cancelled"))])

    def _check_deadlines(self, now_mono: float) -> None:
        timed_out = [
            r
            for r in self._in_hand.values()
            if r.deadline is not None and now_mono >= r.deadline and not r.settled
        ]
        if not timed_out:
            return
        settle = []
        for running in timed_out:
            self._abort(running, "timeout")
            assert running.task is not None
            delay = running.task.backoff.delay(running.job.attempts)
            limit = running.task.timeout
            error = f"TimeoutError: job {running.job.id} ran past its timeout of {limit}s"
            retry_at = utcnow() + timedelta(seconds=delay)
            settle.append((running, Outcome("fail", error=error, run_at=retry_at)))
        # The slot stays taken until the handler really returns (a sync handler
        # cannot be interrupted); only its outcome is recorded now.
        self._write_outcomes(settle)

    def _progress(self, running: Running, fraction: float | None, message: str | None) -> bool:
        return self.store.job_progress(
            Lease(running.job.id, running.token), fraction, message, utcnow()
        )

    # --- stopping ---------------------------------------------------------------------

    def _drain_step(self, now_mono: float) -> bool:
        """One step of a drain; True when the worker may exit."""
        if self._drain_deadline is None:
            self._drain_deadline = now_mono + self.options.stop_timeout
            log.info("stopping: %d job(s) in hand", len(self._in_hand))
        pending = [r for r in self._in_hand.values() if not r.settled]
        if pending and (self._hard_stop.is_set() or now_mono >= self._drain_deadline):
            for running in pending:
                self._abort(running, "shutdown")
            # Release now: a sync handler may never return, and the job must
            # be free for another worker at once, not after the lease expires.
            self._write_outcomes([(r, Outcome("release")) for r in pending])
            return True
        return not pending

    def _on_store_change(self, channel: str, payload: str) -> None:
        if channel == "cancel":
            try:
                job_id = int(payload)
            except ValueError:
                job_id = -1
            if job_id in self._in_hand or job_id == -1:
                self._wake.set("cancel")
            else:
                # Perhaps ours all the same: a job whose claim is committed but not yet
                # handed to this loop. Look once it is (rate-limited, not forced).
                self._wake.set("cancel-other")
            return
        if channel not in ("jobs", "any", "reconnected"):
            return  # e.g. "done": another job finished, nothing to claim
        if channel == "jobs" and payload and payload not in self.options.queues:
            return
        self._wake.set(channel)

    def _shutdown(self) -> None:
        self.app.changes.remove(self._on_store_change)
        try:
            self._record_finished()
            leftover = [r for r in self._in_hand.values() if not r.settled and not r.lost]
            if leftover:
                self._write_outcomes([(r, Outcome("release")) for r in leftover])
        finally:
            # Idle handler threads end now (no work comes after the loop), whatever
            # the rest of the shutdown meets.
            self._threads.close()
            # Every outcome is written before the worker says it has stopped.
            self._acks.close(timeout=max(self.options.stop_timeout, 10.0))
            if self._maintenance is not None:
                self._maintenance.stop()
            if self._loop_thread is not None:
                self._loop_thread.close()
            try:
                self.store.worker_unregister(self.id)
            except Exception:
                log.exception("could not unregister worker %s", self.id)
            self._stopped.set()
