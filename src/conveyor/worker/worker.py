"""The worker: claims jobs, runs their handlers, records outcomes, holds leases, drains.

The parts, each with one job and its own failures:

- the control loop (this module, one thread) claims as many jobs as there are
  free slots, hands them to the executor, turns returned handlers into
  outcomes, enforces timeouts, passes cancels on and drains at shutdown. It
  owns every attempt it holds (``_held``); other threads talk to it only
  through its inbox (deques it drains) and its latch (``Wakeup``);
- the executor (``executor.py``) runs handlers: ``def`` ones on the handler
  threads, ``async def`` ones on an event loop the worker owns;
- the completer (``completer.py``) records outcomes in batches, retrying while
  the database is away; an attempt stays held (and its lease renewed) until
  its outcome is written. On a store that can (Redis), a batch also claims the
  jobs for the slots its outcomes free: the control loop promises that room to
  it (``_fetching``) and starts what comes back as claimed jobs;
- the lease keeper (``leases.py``) renews every held lease each third of the
  lease, whatever the rest is doing;
- maintenance (``maintenance.py``): rescue, retention, periodic tasks, one
  leader at a time.

Each duty of the control loop (claim, cancels, timers) runs on its own: an
exception is logged and that duty alone backs off, never the others, and no
loop retries at full speed. An attempt is held until its handler has returned,
also after a cancel or a timeout: a job, and its group, never runs twice at
once in one worker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import FrameType
from typing import Any

from conveyor.changes import ids_payload
from conveyor.context import Context
from conveyor.errors import ConfigurationError
from conveyor.job import Job, utcnow
from conveyor.logs import job_fields
from conveyor.pacing import DutyBackoff
from conveyor.store.finish_fetch import FetchNext, FinishFetchStore
from conveyor.store.records import Lease, LeaseStatus
from conveyor.store.worker_control import read_control
from conveyor.worker.completer import Completer, CompleterThread, Settlement
from conveyor.worker.executor import (
    EventLoopThread,
    Fleet,
    Outcome,
    Running,
    apply_abort,
    poison_outcome,
)
from conveyor.worker.handler_threads import HandlerThreads
from conveyor.worker.hooks import StoreHooks, job_lease
from conveyor.worker.leases import LeaseKeeper
from conveyor.worker.maintenance import Maintenance
from conveyor.worker.options import WorkerOptions
from conveyor.worker.runtime import Runtime
from conveyor.worker.talk import describe_finished, log_start, log_summary
from conveyor.worker.wakeup import Wakeup

log = logging.getLogger("conveyor.worker")

#: How long a worker passes on the jobs of a task it does not know (a rolling deploy
#: may be under way) before it fails them: long, since failing loses the work.
DEFAULT_UNKNOWN_TASK_PATIENCE = 24 * 3600.0
#: Longest a drain waits, after aborting the handlers still running at the end
#: of stop_timeout, for them to return before their jobs are released anyway
#: (after a second interrupt: the shorter one).
ABORT_GRACE = 0.5
HARD_STOP_GRACE = 0.1
#: Least time between two looks for cancel requests in the database. On SQLite
#: every commit of another connection wakes the worker (it cannot tell a cancel
#: from a claim), so this bounds what those wakes cost; a cancel from this
#: process reaches the handler directly, and one from PostgreSQL is named.
CANCEL_CHECK_INTERVAL = 0.25


class Duty:
    """One duty of the control loop: after an error it alone waits, longer each time."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.backoff = DutyBackoff(name, log)

    @property
    def retry_at(self) -> float:
        return self.backoff.retry_at

    def run(self, action: Callable[[], Any], now: float) -> bool:
        """Run ``action`` unless backing off; False when it did not run or failed."""
        if not self.backoff.ready(now):
            return False
        try:
            action()
        except Exception as exc:
            self.backoff.failed(exc, now)
            return False
        self.backoff.succeeded()
        return True


class Worker:
    """Runs an App's jobs. ``run()`` blocks; ``start()``/``stop()`` or ``with`` use a thread."""

    def __init__(
        self,
        runtime: Runtime,
        queues: Sequence[str] | None = None,
        concurrency: int = 8,
        burst: bool = False,
        stop_timeout: float = 30.0,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        maintenance: bool = True,
        name: str | None = None,
        prefetch: int = 0,
        unknown_task_patience: float = DEFAULT_UNKNOWN_TASK_PATIENCE,
        finish_fetch: bool = False,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        if prefetch < 0:
            raise ConfigurationError("prefetch must be 0 (off) or more")
        if lease <= 0.1:
            raise ConfigurationError("lease must be longer than 0.1 seconds")
        if poll_interval <= 0:
            raise ConfigurationError("poll_interval must be positive")
        if not unknown_task_patience >= 0:
            raise ConfigurationError("unknown_task_patience must be 0 or more seconds")
        served = sorted({t.queue for t in runtime.tasks.values()})
        chosen = tuple(queues) if queues else tuple(served)
        if not chosen:
            raise ConfigurationError("no queues to work on: register tasks or pass queues=[...]")
        self.runtime = runtime
        self.store = runtime.store
        self.options = WorkerOptions(
            chosen, concurrency, burst, stop_timeout, lease, poll_interval, maintenance, prefetch
        )
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: How jobs of tasks this worker does not know are passed on to the fleet.
        self._fleet = Fleet(self.id, float(unknown_task_patience))
        #: The slots in use now: the option's, or what an operator asked since.
        self._concurrency = concurrency
        #: Claiming nothing new (``conveyor workers quiet``); finishing what it holds.
        self._quiet = False
        self._control: dict[str, Any] = {}
        self._lease = timedelta(seconds=lease)
        self._wake = Wakeup()
        self._hooks = WorkerHooks(self)

        # --- owned by the control loop ---
        #: Attempts held under a lease, by job id: claimed, and not yet recorded.
        self._held: dict[int, Running] = {}
        #: Claims of a job whose previous attempt's handler has not returned yet
        #: (its lease was lost and the job came back to us): they wait for it,
        #: their leases renewed like any other.
        self._parked: dict[int, Running] = {}
        #: Parked claims whose previous handler has returned: each starts once a
        #: renewal has shown that its lease still holds, never before.
        self._unblocked: set[int] = set()
        #: Attempts whose handler has not returned (they take the slots).
        self._active = 0
        #: Prefetched attempts: held (leased) and waiting for a free slot, oldest first.
        self._waiting: deque[Running] = deque()
        #: Slots promised to the jobs the completer's batches in flight claim as they
        #: finish (a store with FinishFetchStore): no claim of ours takes them meanwhile.
        self._fetching = 0
        #: Started attempts with a timeout, whose handler has not returned.
        self._timed: set[Running] = set()
        #: ``_held`` changed since its snapshot was last published.
        self._held_changed = False
        self._maybe_ready = True
        self._next_timer: float | None = None
        #: Answers "now" of next_run_in since the last claim that took a job.
        self._now_answers = 0
        self._next_poll = 0.0
        self._next_cancel_check = 0.0
        self._cancel_check_due = False
        self._drain_deadline: float | None = None
        self._abort_deadline: float | None = None
        self._claim = Duty("claim")
        self._timer = Duty("next run_at")
        self._cancels = Duty("cancel check")
        self.counts: Counter[str] = Counter()

        # --- inboxes: written by other threads, drained by the control loop ---
        self._returned: deque[Running] = deque()
        self._recorded: deque[tuple[list[Running], set[int], list[Job], int]] = deque()
        self._renewed: deque[tuple[list[Lease], dict[int, LeaseStatus]]] = deque()
        self._local_cancels: deque[tuple[int, str]] = deque()
        #: What an operator asked of this worker, as its last check-in read it.
        self._controls: deque[dict[str, Any]] = deque()
        #: What the lease keeper renews: replaced (never changed) by the control loop.
        self._held_snapshot: tuple[Running, ...] = ()

        self._threads = HandlerThreads(concurrency, done=self._handler_returned)
        self._loop_thread: EventLoopThread | None = None
        #: Finishes that claim the next jobs too, where the store can (one round trip).
        #: Off unless asked for: measured at 30,000 jobs on Redis, a worker that left
        #: its freed slots to its next finish ran 0.53-0.62x BullMQ's speed, against
        #: 0.67-0.85x claiming them itself (BENCHMARKS.md, 2026-11-28).
        self._finish_fetches = finish_fetch and isinstance(runtime.store, FinishFetchStore)
        fetch = FetchNext(self.options.queues, 0, self.id, self._lease)
        self._completer = CompleterThread(
            Completer(runtime.store, runtime.changes, runtime.codec),
            self._outcomes_recorded,
            fetch if self._finish_fetches else None,
        )
        self._leases = LeaseKeeper(
            runtime.store, self.id, lease, lambda: self._held_snapshot, self._leases_renewed,
            on_control=self._control_heard,
        )  # fmt: skip
        self._maintenance: Maintenance | None = None
        self._started = False
        self._stopping = threading.Event()
        self._hard_stop = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = time.monotonic()

    @property
    def concurrency(self) -> int:
        """The slots in use now: as started, or as an operator asked since."""
        return self._concurrency

    @property
    def quiet(self) -> bool:
        """Claiming nothing new, as an operator asked (``conveyor workers quiet``)."""
        return self._quiet

    @property
    def processed(self) -> int:
        """Jobs whose outcome this worker recorded."""
        return sum(self.counts.values())

    # --- public control ---------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (or, in burst mode, until nothing is ready). Returns an exit code.

        In the main thread, SIGTERM and SIGINT start a graceful drain; a second
        SIGINT stops at once (still releasing held jobs).
        """
        self._claim_start()
        restore = self._install_signal_handlers()
        try:
            self._work()
        finally:
            for signum, handler in restore.items():
                signal.signal(signum, handler)
        return 0

    def start(self) -> Worker:
        """Run in a background thread (for tests and embedding)."""
        self._claim_start()
        self._thread = threading.Thread(target=self._work, name=f"conveyor-worker-{self.id}")
        self._thread.start()
        return self

    def _claim_start(self) -> None:
        if self._started:
            raise RuntimeError(f"worker {self.id} was already started; make a new Worker")
        # A database without conveyor's tables (or with older ones) says so now,
        # in the caller's thread: "run conveyor migrate", not "no such table".
        self.runtime.check_schema()
        self._started = True

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
        try:
            self.runtime.changes.add(self._on_store_change)
            log_start(self.runtime, self.id, self.options)
            try:
                self.store.worker_register(
                    self.id, socket.gethostname(), os.getpid(), list(self.options.queues),
                    self.options.concurrency, utcnow(),
                )  # fmt: skip
            except Exception as exc:  # only the workers list: the lease keeper checks in again
                log.warning("could not register worker %s: %s", self.id, exc)
            self._leases.start()
            if self.options.maintenance:
                self._maintenance = Maintenance(self.runtime, self.id, self.options.lease)
                self._maintenance.start()
            while not self._step():
                pass
        finally:
            self._shutdown()

    def _step(self) -> bool:
        """One round of the control loop; True when the worker may exit."""
        self._read_inbox()
        now = time.monotonic()
        if self._stopping.is_set():
            if self._drain_step(now):
                return True
        else:
            claimed = self._claim_if_useful(now)
            if self.options.burst and self._burst_done(claimed):
                return True
        self._check_deadlines(now)
        if self._cancel_check_due and now >= self._next_cancel_check:
            self._cancel_check_due = False
            self._next_cancel_check = now + CANCEL_CHECK_INTERVAL
            if not self._cancels.run(self._check_cancels, now):
                self._cancel_check_due = True
        self._publish_held()
        reasons = self._wake.wait(self._sleep_time())
        if reasons & {"jobs", "any", "reconnected"}:
            self._maybe_ready = True
        if reasons & {"cancel", "any", "reconnected"}:
            self._cancel_check_due = True
        return False

    def _burst_done(self, claimed: bool) -> bool:
        return (
            not claimed
            and not self._maybe_ready
            and not self._held
            and not self._parked
            and not self._returned
            and not self._recorded
        )

    def _sleep_time(self) -> float:
        now = time.monotonic()
        until = self._next_poll
        if self._next_timer is not None:
            until = min(until, self._next_timer)
        if self._maybe_ready and self._claim_room() > 0:
            until = min(until, self._claim.retry_at)
        if self._cancel_check_due:
            until = min(until, self._next_cancel_check)
        for running in self._timed:
            if running.deadline is not None and running.abort is None:
                until = min(until, running.deadline)
        if self._stopping.is_set():
            until = min(until, now + 0.05)
        return max(0.0, until - now)

    def _publish_held(self) -> None:
        if self._held_changed:
            self._held_changed = False
            # Parked claims too: their leases must hold until they start.
            self._held_snapshot = (*self._held.values(), *self._parked.values())

    # --- inbox ------------------------------------------------------------------------

    def _handler_returned(self, running: Running) -> None:
        """From a handler thread or the event loop: the handler returned."""
        self._returned.append(running)
        self._wake.pull("returned")

    def _outcomes_recorded(
        self, runnings: list[Running], written: set[int], fetched: list[Job], asked: int
    ) -> None:
        """From the completer's thread: a batch was written (or given up), and what it claimed."""
        self._recorded.append((runnings, written, fetched, asked))
        self._wake.pull("recorded")

    def _leases_renewed(self, renewed: Sequence[Running], statuses: dict[int, LeaseStatus]) -> None:
        """From the lease keeper's thread."""
        self._renewed.append(([Lease(r.id, r.token) for r in renewed], statuses))
        self._wake.pull("renewed")

    def _read_inbox(self) -> None:
        settled: list[Settlement] = []
        while self._returned:
            running = self._returned.popleft()
            outcome = self._returned_outcome(running)
            if outcome is not None:
                running.recorded = outcome
                settled.append((running, outcome))
            # Slots freed: prefetched (and parked) attempts start now.
            self._start_waiting()
        self._completer.submit(settled, self._fetch_room(settled))
        while self._recorded:
            runnings, written, fetched, asked = self._recorded.popleft()
            self._after_recorded(runnings, written)
            self._fetched(fetched, asked)
        while self._renewed:
            renewed, statuses = self._renewed.popleft()
            for lease in renewed:
                status = statuses.get(lease.id)
                if status is not None and status.busy:
                    continue  # not renewed this time, not lost either: the next renewal says
                parked = self._parked.get(lease.id)
                if parked is not None and parked.token == lease.token:
                    self._parked_renewed(parked, status)
                    continue
                attempt = self._held.get(lease.id)
                if attempt is None or attempt.token != lease.token or attempt.recorded:
                    continue  # another attempt by now, or already being recorded
                if status is None and attempt.context.completed_in_transaction:
                    continue  # succeeded in the handler's own transaction (ctx.complete)
                if status is None and attempt.context.parked:
                    continue  # parked by its wait (ctx.wait_for): queued again already
                if status is None:
                    self._abort(attempt, "lease lost")
                elif status.cancel_requested:
                    self._abort(attempt, "cancel")
        while self._controls:
            self._obey(self._controls.popleft())
        while self._local_cancels:
            job_id, token = self._local_cancels.popleft()
            held = self._held.get(job_id)
            if held is not None and held.token == token:
                self._abort(held, "cancel")
            parked = self._parked.get(job_id)
            if parked is not None and parked.token == token:
                self._end_parked(parked, Outcome("cancelled"))

    def _control_heard(self, text: str | None) -> None:
        """From the lease keeper's check-in: what an operator asks now (a change wakes the loop)."""
        control = read_control(text)
        if control != self._control:
            self._control = control
            self._controls.append(control)
            self._wake.pull("control")

    def _obey(self, control: dict[str, Any]) -> None:
        """Quiet, concurrency and stop as an operator asked (conveyor.store.worker_control)."""
        quiet = bool(control.get("quiet"))
        if quiet != self._quiet:
            self._quiet = quiet
            log.info("worker %s %s", self.id,
                     "quiet: claims nothing new" if quiet else "claims again")  # fmt: skip
        concurrency = control.get("concurrency", self.options.concurrency)
        if concurrency != self._concurrency:
            log.info("worker %s: concurrency %s (was %s)", self.id, concurrency, self._concurrency)
            self._concurrency = concurrency
            self._threads.resize(concurrency)
            self._start_waiting()
        if control.get("stop") and not self._stopping.is_set():
            log.info("worker %s: stop asked by an operator: draining (up to %ss)",
                     self.id, self.options.stop_timeout)  # fmt: skip
            self._stopping.set()
        self._maybe_ready = True

    def _parked_renewed(self, parked: Running, status: LeaseStatus | None) -> None:
        """A renewal's answer for a parked claim: drop it, end it, start it, or keep it parked."""
        if status is None:
            log.warning(
                "job %s: a claim waiting for the previous attempt's handler lost its lease; "
                "dropped, never started",
                parked.id,
                extra=job_fields(parked.job),
            )
            del self._parked[parked.id]
            self._unblocked.discard(parked.id)
            self._held_changed = True
            self.counts["lost"] += 1
        elif status.cancel_requested:
            self._end_parked(parked, Outcome("cancelled"))
        elif parked.id in self._unblocked:
            del self._parked[parked.id]
            self._unblocked.discard(parked.id)
            self._held[parked.id] = parked
            self._held_changed = True
            self._waiting.appendleft(parked)
            self._start_waiting()

    def _end_parked(self, parked: Running, outcome: Outcome) -> None:
        """Record an outcome for a parked claim that never started (a cancel, a drain)."""
        del self._parked[parked.id]
        self._unblocked.discard(parked.id)
        self._held_changed = True
        parked.recorded = outcome
        self._completer.submit([(parked, outcome)])

    def _returned_outcome(self, running: Running) -> Outcome | None:
        """What a returned handler's attempt records (None: nothing, its lease is gone)."""
        if running.returned:  # released by a drain that stopped waiting for it
            return None
        running.returned = True
        self._active -= 1
        self._timed.discard(running)
        if running.abort == "lease lost":
            log.warning("job %s: lease lost while its handler ran; its outcome is dropped",
                        running.id, extra=job_fields(running.job))  # fmt: skip
            if self._held.get(running.id) is running:
                del self._held[running.id]
                self._held_changed = True
            self.counts["lost"] += 1
        if running.id in self._parked:
            # The next attempt of the same job may start, once a renewal shows
            # that its lease held while it waited (soon: renew now).
            self._unblocked.add(running.id)
            self._leases.renew_soon()
        if running.abort == "lease lost":
            return None
        # A cancel, a timeout or a drain asked before the handler returned is in
        # its outcome already (apply_abort, in the handler's thread).
        assert running.outcome is not None
        return running.outcome

    def _after_recorded(self, runnings: list[Running], written: set[int]) -> None:
        for running in runnings:
            if self._held.get(running.id) is running:
                del self._held[running.id]
                self._held_changed = True
            if running.id in written:
                outcome = describe_finished(running)
                self.counts[outcome] += 1
            else:
                self.counts["lost"] += 1
                log.warning(
                    "job %s: lease lost before its outcome was recorded; another worker owns it",
                    running.id,
                    extra=job_fields(running.job),
                )
            # The group's next job, or the job itself queued again, may now be ready.
            recorded = running.recorded
            if running.job.group is not None or (
                recorded is not None and recorded.kind in ("retry", "snooze", "release")
            ):
                self._maybe_ready = True
                # No timer for a job passed on because its task is unknown here:
                # a worker that knows it should be first to look when it is due.
                if recorded is not None and recorded.run_at is not None and running.task:
                    delay = (recorded.run_at - utcnow()).total_seconds()
                    self._set_timer(time.monotonic() + max(0.0, delay))

    # --- claiming -------------------------------------------------------------------

    def _fetch_room(self, settled: list[Settlement]) -> int:
        """How many jobs the finish of ``settled`` claims: the room a claim would fill now
        (promised to it until its answer comes); none while stopping, or when the last
        claim found all there was (a wake or the poll makes the next claim)."""
        if not settled or not self._finish_fetches or self._stopping.is_set():
            return 0
        if not self._maybe_ready:
            return 0
        room = max(0, self._claim_room())
        self._fetching += room
        return room

    def _fetched(self, jobs: list[Job], asked: int) -> None:
        """Jobs a finish claimed: started as a claim's are; a stopping worker gives them back."""
        self._fetching -= asked
        if not jobs:
            return
        self._now_answers = 0
        self.runtime.changes.publish("claimed", ids_payload(jobs))
        if not self._stopping.is_set():
            self._dispatch(jobs)
            return
        # Claimed as the worker began to stop: released at once (the attempt does not
        # count), held until the release is written so that the drain waits for it.
        settled: list[Settlement] = []
        for job in jobs:
            running = self._running(job)
            running.returned = True
            running.recorded = Outcome("release")
            if job.id not in self._held:
                self._held[job.id] = running
                self._held_changed = True
            settled.append((running, running.recorded))
        if self._completer.closed:
            self._after_recorded([r for r, _ in settled], self._completer.record_now(settled))
        else:
            self._completer.submit(settled)

    def _claim_if_useful(self, now: float) -> bool:
        """Fill free slots when something may be ready; True if anything was claimed."""
        if self._next_timer is not None and self._next_timer <= now:
            self._next_timer = None
            self._maybe_ready = True
        if now >= self._next_poll:
            self._maybe_ready = True
            self._next_poll = now + self.options.poll_interval
        free = self._claim_room()
        if free <= 0 or not self._maybe_ready:
            return False
        jobs: list[Job] = []

        def claim() -> None:
            # No ``now``: the store's clock judges run_at and sets the lease.
            jobs.extend(self.store.job_claim(self.options.queues, free, self.id, self._lease))

        if not self._claim.run(claim, now):
            return False
        # A full claim means more may be waiting; a partial one means we got all
        # there was that we may take. What was not taken waits for a wake, a
        # timer for the next job that becomes due, or the fallback poll.
        self._maybe_ready = len(jobs) == free
        if jobs:
            self._now_answers = 0
            # In process, no statement more: PostgreSQL and Redis send nothing for
            # a claim (SQLite's file watch hears it as "any").
            self.runtime.changes.publish("claimed", ids_payload(jobs))
        self._dispatch(jobs)
        if len(jobs) < free:
            self._timer.run(self._set_next_run_timer, now)
        return bool(jobs)

    def _claim_room(self) -> int:
        """How many jobs to claim now: the free slots, and the prefetch room.

        With prefetch, no claim while more jobs wait than there are slots: the
        next claim then fills the room in one batch instead of a claim per few
        handlers returned, and the slots still never run dry.
        """
        if self._quiet:
            return 0
        if self.options.prefetch and len(self._waiting) > self._concurrency:
            return 0
        held = self._active + len(self._waiting) + len(self._parked) + self._fetching
        return self._concurrency + self.options.prefetch - held

    def _set_next_run_timer(self) -> None:
        # Also when a limit lets the next job through: a worker whose ready jobs a
        # rate or a throttle holds back sleeps until then.
        seconds = self.store.next_run_in(self.options.queues)
        if seconds is None:
            return
        if seconds <= 0.001:
            # "Now": a limited queue has room that another claim held a moment ago
            # (or a job is due within the millisecond). A floor, so that this cannot
            # make a hot loop, doubling while such answers bring no job.
            self._now_answers += 1
            seconds = min(0.001 * 2 ** min(self._now_answers - 1, 16), self.options.poll_interval)
        else:
            self._now_answers = 0
        self._set_timer(time.monotonic() + seconds)

    def _set_timer(self, at: float) -> None:
        if self._next_timer is None or at < self._next_timer:
            self._next_timer = at

    def _dispatch(self, jobs: list[Job]) -> None:
        ready: list[Running] = []
        for job in jobs:
            running = self._running(job)
            earlier = self._held.get(job.id)
            if earlier is not None and not earlier.returned:
                # Our earlier attempt still runs, and this claim proves that its
                # lease is gone (the job was queued again): tell its handler, and
                # keep this claim, leased, until that handler returns. One at a time.
                if earlier.abort is None:
                    self._abort(earlier, "lease lost")
                else:  # already asked to stop (a cancel, a timeout): its outcome is moot too
                    earlier.abort = "lease lost"
                self._parked[job.id] = running
                self._held_changed = True
                continue
            # (An earlier attempt that returned may still await the completer's
            # answer, which can come after the job was queued again and claimed.)
            self._held[job.id] = running
            self._held_changed = True
            ready.append(running)
        self._start(ready)

    def _running(self, job: Job) -> Running:
        return Running(
            job=job,
            task=self.runtime.tasks.get(job.task),
            context=Context(job, _hooks=self._hooks),
            middleware=self.runtime.middleware(),
        )

    def _start(self, runnings: list[Running]) -> None:
        """Hand attempts to the executor as slots allow; the rest wait, held, in order."""
        self._waiting.extend(runnings)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting attempts while slots are free; one that cannot start ends at once."""
        batch: list[Running] = []
        while self._waiting and self._active < self._concurrency:
            running = self._waiting.popleft()
            running.started = time.monotonic()
            self._active += 1
            try:
                poison = poison_outcome(running, self._fleet, self.runtime.codec)
                if poison is not None:
                    running.outcome = poison
                    self._handler_returned(running)
                    continue
                assert running.task is not None
                if running.task.timeout is not None:
                    running.deadline = running.started + running.task.timeout
                    self._timed.add(running)
                if running.task.is_async:
                    batch.append(running)
                else:
                    self._threads.submit(running)
            except Exception as exc:
                log.exception(
                    "job %s: could not start its handler", running.id, extra=job_fields(running.job)
                )
                running.outcome = Outcome("fail", error=f"could not start the handler: {exc}")
                self._handler_returned(running)
        if batch:
            if self._loop_thread is None:
                self._loop_thread = EventLoopThread(self._handler_returned)
            self._loop_thread.submit(batch)

    # --- cancels and timeouts ------------------------------------------------------

    def _check_cancels(self) -> None:
        """Look for cancel requests of held jobs (quick path; the lease keeper is the fallback)."""
        watched = [r for r in self._held.values() if not r.returned and r.abort is None]
        if not watched:
            return
        for job in self.store.job_get_many([r.id for r in watched]):
            running = self._held.get(job.id)
            if running is not None and job.cancel_requested and job.lease_token == running.token:
                self._abort(running, "cancel")

    def _abort(self, running: Running, reason: str) -> None:
        """Ask a handler to stop; its attempt stays held until it returns."""
        if running.abort is not None or running.returned:
            return
        running.abort = reason
        if running in self._waiting:
            # Prefetched, never started: it ends now, as if its handler had
            # returned at once (the abort's reason decides what is recorded).
            self._waiting.remove(running)
            running.outcome = Outcome("release")
            apply_abort(running)  # a cancel ends it cancelled
            self._active += 1  # given back when the return is read
            self._handler_returned(running)
            return
        running.context.cancelled.set(reason)
        if running.task is not None and running.task.is_async and self._loop_thread is not None:
            self._loop_thread.cancel(running)

    def _check_deadlines(self, now: float) -> None:
        for running in list(self._timed):
            if (
                running.deadline is not None
                and now >= running.deadline
                and running.abort is None
                and not running.returned
            ):
                self._abort(running, "timeout")
                assert running.task is not None
                self._leases.note(
                    running,
                    f"timed out after {running.task.timeout}s; waiting for the handler to return",
                )

    # --- stopping ---------------------------------------------------------------------

    def _drain_step(self, now: float) -> bool:
        """One step of a drain; True when the worker may exit."""
        if self._drain_deadline is None:
            self._drain_deadline = now + self.options.stop_timeout
            log.info("stopping: %d job(s) in hand", self._active + len(self._waiting))
            # Prefetched jobs that never started go straight back, like parked claims.
            for r in list(self._waiting):
                self._abort(r, "shutdown")
            # Claims that never started go straight back.
            for r in list(self._parked.values()):
                self._end_parked(r, Outcome("release"))
        running = [r for r in self._held.values() if not r.returned]
        if not running:
            return not self._held  # every outcome recorded (or handed to the completer)
        if self._hard_stop.is_set() or now >= self._drain_deadline:
            if self._abort_deadline is None:
                grace = HARD_STOP_GRACE if self._hard_stop.is_set() else ABORT_GRACE
                self._abort_deadline = now + grace
                for r in running:
                    self._abort(r, "shutdown")
            elif now >= self._abort_deadline:
                # A sync handler that ignores its cancel signal cannot be stopped:
                # release its job now so that it runs elsewhere, and say so.
                settled: list[Settlement] = []
                for r in running:
                    outcome = given_up(r)
                    r.returned = True
                    r.recorded = outcome
                    self._active -= 1
                    self._timed.discard(r)
                    settled.append((r, outcome))
                self._completer.submit(settled)
                return True
        return False

    def _on_store_change(self, channel: str, payload: str) -> None:
        if channel == "cancel":
            job_id, _, token = payload.partition(":")
            if token and job_id.isdigit():
                # From this process (app.cancel): straight to the handler.
                self._local_cancels.append((int(job_id), token))
                self._wake.set("local-cancel")
            else:
                self._wake.set("cancel")
            return
        if channel not in ("jobs", "any", "reconnected"):
            return  # "done", "progress": nothing to claim
        if channel == "jobs" and payload and payload not in self.options.queues:
            return
        self._wake.set(channel)

    def _shutdown(self) -> None:
        self.runtime.changes.remove(self._on_store_change)
        try:
            self._read_inbox()
            leftover = [r for r in self._held.values() if not r.recorded and not r.returned]
            parked = list(self._parked.values())
            self._parked.clear()
            settled: list[Settlement] = []
            for r in leftover:
                settled.append((r, given_up(r)))
            settled += [(r, Outcome("release")) for r in parked]  # never started
            for r, outcome in settled:
                r.recorded = outcome
            self._completer.submit(settled)
        finally:
            # Idle handler threads end now (no work comes after the loop).
            self._threads.close()
            # Every outcome is written before the worker says it has stopped; the
            # leases are kept until then.
            self._completer.close(timeout=max(self.options.stop_timeout, 10.0))
            self._read_inbox()
            self._leases.stop()
            if self._maintenance is not None:
                self._maintenance.stop()
            if self._loop_thread is not None:
                self._loop_thread.close()
            try:
                self.store.worker_unregister(self.id)
            except Exception:
                log.exception("could not unregister worker %s", self.id)
            log_summary(self.id, self.counts, time.monotonic() - self._began)
            self._stopped.set()


def given_up(running: Running) -> Outcome:
    """What a drain that stops waiting for an attempt records, and says so in the log.

    A release, so that the job runs elsewhere, unless the handler did return
    and only the middleware's after-hooks hang: then the handler's own outcome,
    since a release would run a job that is done a second time.
    """
    if running.handled and running.outcome is not None:
        log.warning(
            "job %s: the middleware's after_attempt hooks did not return after the stop "
            "timeout; recording the handler's outcome without them",
            running.id,
            extra=job_fields(running.job),
        )
        return running.outcome
    log.warning(
        "job %s: the handler did not return after the stop timeout; "
        "releasing the job (the handler may still run until this process exits)",
        running.id,
        extra=job_fields(running.job),
    )
    return Outcome("release")


def progress_payload(job_id: int, fraction: float | None, message: str | None) -> str:
    """``id<TAB>fraction<TAB>message`` for in-process progress listeners."""
    shown = "" if fraction is None else repr(fraction)
    return f"{job_id}\t{shown}\t{message or ''}"


class WorkerHooks(StoreHooks):
    """A Context's hooks under a worker: progress heard in this process at once, and a
    renewal's news (a lost lease, a cancel) handed to the control loop."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.runtime, worker._lease)
        self.worker = worker

    def publish_progress(self, job: Job, fraction: float | None, message: str | None) -> None:
        self.runtime.changes.publish("progress", progress_payload(job.id, fraction, message))

    def heartbeat(self, job: Job) -> bool:
        """``ctx.heartbeat()``: renew one lease now; the control loop hears what it learns."""
        statuses = self.store.job_heartbeat([job_lease(job)], self._lease)
        if not statuses or statuses[0].cancel_requested:
            self.worker._renewed.append(([job_lease(job)], {s.id: s for s in statuses}))
            self.worker._wake.pull("renewed")
        return bool(statuses)
