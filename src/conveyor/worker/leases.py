"""Lease renewal, in a thread of its own so that nothing else can stop it.

Every third of the lease, all the leases the worker holds are renewed in one
statement: attempts that run, attempts that wait for a slot, and claims parked
behind a previous attempt of the same job (they start only after a renewal
has shown their lease still holds). The control loop publishes what it holds
as an immutable snapshot and learns from its inbox which leases were lost and
which jobs have a cancel pending: the keeper owns no job state. A failed
renewal is retried after a short pause (the one backoff of every duty,
``pacing.py``), well within the lease; a control loop that is stuck or failing
does not stop it, and neither does a handler that blocks its event loop.

A keeper may also be asked to look for cancel requests (``check_soon``): a
consumer does so whenever its store feed reports a change it cannot name
(SQLite's file watch reports every commit, the renewals of every consumer
included). That look is a read, at most every ``CHECK_INTERVAL``, never a
renewal: a renewal is a commit, which the feed would report again, and a
consumer would renew hundreds of times a second.

Throttled progress and notes (a timeout waiting for its handler) are written
here too, on the same rhythm. They are telemetry: one that cannot be written
(the database is away) waits for the next round, or is replaced by newer
progress, and never reaches the handler as an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from conveyor.job import JobState, utcnow
from conveyor.pacing import DutyBackoff
from conveyor.store.protocols import JobStore
from conveyor.store.records import Lease, LeaseStatus
from conveyor.worker.executor import Running

log = logging.getLogger("conveyor.worker")

#: How many times per interval a lease passed over as busy is tried again.
BUSY_RETRIES = 6

#: Told what the renewal learned: the attempts renewed, and the status of each
#: lease that still held (by job id). An attempt missing from it lost its lease.
OnRenewed = Callable[[Sequence[Running], dict[int, LeaseStatus]], None]

#: The shortest spell between two looks for cancel requests (``check_soon``), in
#: seconds: as often as a worker's control loop looks for its own.
CHECK_INTERVAL = 0.25


class LeaseKeeper:
    def __init__(
        self,
        store: JobStore,
        worker_id: str,
        lease: float,
        held: Callable[[], Sequence[Running]],
        on_renewed: OnRenewed,
        check_in: bool = True,
        on_control: Callable[[str | None], None] | None = None,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._lease = timedelta(seconds=lease)
        self.interval = lease / 3
        self._held = held
        self._on_renewed = on_renewed
        #: Keep the worker's row in the workers list fresh (not for a consumer, which has none).
        self._check_in = check_in
        #: Told what an operator asked of the worker, at each check-in.
        self._on_control = on_control
        self._notes: dict[tuple[int, str], str] = {}
        self._notes_lock = threading.Lock()
        self._stop = threading.Event()
        #: Pulled whenever the thread should look at its flags below before its time.
        self._now = threading.Event()
        self._renew_asked = threading.Event()
        self._check_asked = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-leases", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._now.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def renew_soon(self) -> None:
        """Renew at once (the control loop was away from the database and wants to know)."""
        self._renew_asked.set()
        self._now.set()

    def check_soon(self) -> None:
        """Look for cancel requests of the held jobs soon: a read, at most every CHECK_INTERVAL."""
        self._check_asked.set()
        self._now.set()

    def note(self, running: Running, message: str) -> None:
        """Show ``message`` as the running job's progress message at the next renewal."""
        with self._notes_lock:
            self._notes[(running.id, running.token)] = message
        self.renew_soon()

    def _run(self) -> None:
        # Soon after a failure, but never in a loop, and always within the lease.
        backoff = DutyBackoff("lease renewal", log, ceiling=max(self.interval / 2, 0.05))
        next_renewal = next_check = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self._renew_asked.is_set() or now >= next_renewal:
                self._renew_asked.clear()
                self._check_asked.clear()  # the renewal answers the same question
                try:
                    busy = self.renew()
                    backoff.succeeded()
                    # A lease passed over (its row held by another transaction) is
                    # tried again soon: once that transaction ends, it is renewed
                    # before the time it had left runs out, if it has any left.
                    pause = self.interval / BUSY_RETRIES if busy else self.interval
                except Exception as exc:
                    pause = backoff.failed(exc)
                next_renewal = time.monotonic() + pause
            elif self._check_asked.is_set() and now >= next_check:
                self._check_asked.clear()
                next_check = now + CHECK_INTERVAL
                self._check_cancels()
            until = next_renewal
            if self._check_asked.is_set():
                until = min(until, next_check)
            self._now.wait(max(until - time.monotonic(), 0.0))
            self._now.clear()

    def _check_cancels(self) -> None:
        """Tell of cancel requests of held jobs that are still ours; the renewal tells the rest.

        A job found ended, gone or under another token is left out, not reported
        lost: it may have ended by its holder's own hand meanwhile.
        """
        held = {r.id: r for r in self._held() if r.abort != "lease lost"}
        if not held:
            return
        try:
            jobs = self._store.job_get_many(list(held))
        except Exception as exc:  # only a quicker notice: the next renewal tells it too
            log.debug("looking for cancel requests failed: %s", exc)
            return
        ours = [
            (running, job)
            for job in jobs
            if (running := held.get(job.id)) is not None
            and job.state == JobState.RUNNING
            and job.lease_token == running.token
        ]
        if any(job.cancel_requested for _, job in ours):
            statuses = {job.id: LeaseStatus(job.id, job.cancel_requested) for _, job in ours}
            self._on_renewed([running for running, _ in ours], statuses)

    def renew(self) -> bool:
        """Renew every held lease; True when some were passed over (busy: renew them soon)."""
        held = [r for r in self._held() if r.abort != "lease lost"]
        busy: set[int] = set()
        if held:
            leases = [Lease(r.id, r.token) for r in held]
            statuses = self._store.job_heartbeat(leases, self._lease)
            busy = {s.id for s in statuses if s.busy}
            self._on_renewed(held, {s.id: s for s in statuses})
        # Telemetry after the leases: progress that cannot be written now stays
        # pending in its Context for the next round (flush_progress never raises).
        # Not for a job whose row another transaction holds: the write would wait
        # for that transaction, and every lease with it. It stays pending.
        for running in held:
            if running.id not in busy:
                running.context.flush_progress()
        self._write_notes(busy)
        if self._check_in:
            try:
                control = self._store.worker_beat(self._worker_id, len(held), utcnow())
            except Exception as exc:  # only the workers list: never in the way of the leases
                log.debug("worker check-in failed: %s", exc)
            else:
                if self._on_control is not None:
                    self._on_control(control)
        return bool(busy)

    def _write_notes(self, busy: set[int]) -> None:
        with self._notes_lock:
            notes = {key: note for key, note in self._notes.items() if key[0] not in busy}
            self._notes = {key: note for key, note in self._notes.items() if key[0] in busy}
        for index, ((job_id, token), message) in enumerate(notes.items()):
            try:
                self._store.job_progress(Lease(job_id, token), None, message, utcnow())
            except Exception:
                # Kept for the next round, unless a newer note replaced it meanwhile.
                with self._notes_lock:
                    for key, unsent in list(notes.items())[index:]:
                        self._notes.setdefault(key, unsent)
                raise
