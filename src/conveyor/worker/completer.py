"""Recording outcomes: the one way an attempt's end becomes a row.

``Completer.record`` writes outcomes through ``Store.job_finish``; the worker,
``consume`` and the testing helpers all use it. The worker hands it outcomes
through ``CompleterThread``, which writes whatever has piled up in one batch
while the control loop goes straight back to claiming (on PostgreSQL the
acknowledgement of one batch and the claim of the next then travel over two
connections at once).

Two kinds of trouble, told apart: a database that is away (a restart, a
dropped connection, a file locked by another process past the busy timeout, a
full disk: ``StoreUnavailableError``) delays the write, which is retried with backoff
while the worker keeps the leases alive; a database that refuses the data
itself fails that job alone, with the refusal as its error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from conveyor.errors import StoreUnavailableError
from conveyor.job import JobState
from conveyor.logs import job_fields
from conveyor.pacing import DutyBackoff
from conveyor.store.base import Store
from conveyor.worker.changes import ChangeHub
from conveyor.worker.executor import Outcome, Running

log = logging.getLogger("conveyor.worker")

Settlement = tuple[Running, Outcome]
#: Longest pause between two writes of the same outcomes while the database is away.
RETRY_CEILING = 2.0


class Completer:
    def __init__(self, store: Store, changes: ChangeHub) -> None:
        self._store = store
        self._changes = changes

    def record(self, settle: Sequence[Settlement]) -> set[int]:
        """Write the outcomes; return the ids whose lease still held.

        Raises StoreUnavailableError while the database is away (nothing is
        written then). A batch the database refuses is written one outcome at a
        time, so one bad outcome cannot hold back the others, and an outcome it
        refuses becomes a failure that names the refusal.
        """
        if not settle:
            return set()
        try:
            written = self._write(settle)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            if len(settle) == 1:
                written = self._write_fallback(settle[0], exc)
            else:
                written = set()
                for one in settle:
                    written |= self.record([one])
        return written

    def _write(self, settle: Sequence[Settlement]) -> set[int]:
        for running, _ in settle:
            # Progress waiting for its turn (written at most once a second) goes
            # first, under the lease it still holds: a job ends showing the last
            # progress it reported, not one from up to a second before.
            running.context.flush_progress()
        finishes = [outcome.finish(running.id, running.token) for running, outcome in settle]
        written = set(self._store.job_finish(finishes))
        if len(written) < len(settle):
            written |= self._completed_in_transaction(settle, written)
        if written:  # wakes waiters in this process at once
            self._changes.publish("done", ",".join(map(str, sorted(written))))
        return written

    def _completed_in_transaction(
        self, settle: Sequence[Settlement], written: set[int]
    ) -> set[int]:
        """The attempts, among those the finish refused, that succeeded by ``ctx.complete``.

        The handler's transaction committed the job's success, so the finish
        found the job no longer running: nothing more is recorded, and the
        attempt counts as succeeded (not as a lost lease). Told apart from a
        lost lease by the job itself: succeeded, and by no later attempt.
        """
        asked = {
            running.id: running
            for running, _ in settle
            if running.id not in written and running.context.completed_in_transaction
        }
        if not asked:
            return set()
        done: set[int] = set()
        for job in self._store.job_get_many(list(asked)):
            running = asked[job.id]
            if job.state == JobState.SUCCEEDED and job.attempts == running.job.attempts:
                running.recorded = Outcome("complete", result_json=job.result)
                done.add(job.id)
        return done

    def _write_fallback(self, settlement: Settlement, refused: Exception) -> set[int]:
        running, outcome = settlement
        log.error(
            "job %s: the database refused its outcome (%s): %s; failing it instead",
            running.id,
            outcome.kind,
            refused,
            extra=job_fields(running.job),
        )
        error = f"the outcome ({outcome.kind}) could not be recorded: {refused}"
        try:
            return self._write([(running, Outcome("fail", error=error))])
        except StoreUnavailableError:
            raise
        except Exception:
            # The lease runs out and the job is rescued: nothing is lost.
            log.exception(
                "job %s: could not record its failure either",
                running.id,
                extra=job_fields(running.job),
            )
            return set()


#: Told of each written batch: the attempts and the ids whose lease held.
OnRecorded = Callable[[list[Running], set[int]], None]


class CompleterThread:
    """The worker's completer: batches outcomes in a thread, retrying while the database is away."""

    def __init__(self, completer: Completer, on_recorded: OnRecorded) -> None:
        self._completer = completer
        self._on_recorded = on_recorded
        self._pending: list[Settlement] = []
        self._busy = False
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="conveyor-completer", daemon=True)
        self._thread.start()

    def submit(self, settle: list[Settlement]) -> None:
        if not settle:
            return
        with self._cond:
            self._pending.extend(settle)
            self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Write what was submitted, for up to ``timeout``; True when nothing is left unwritten."""
        with self._cond:
            flushed = self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        return flushed

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._busy = True
            try:
                written = self._write_until_done(batch)
                self._on_recorded([running for running, _ in batch], written)
            except Exception:  # a bug of ours: say so, and go on with the next batch
                log.exception("recording %d outcome(s) failed", len(batch))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write_until_done(self, batch: list[Settlement]) -> set[int]:
        backoff = DutyBackoff(f"recording {len(batch)} outcome(s)", log, ceiling=RETRY_CEILING)
        while True:
            try:
                written = self._completer.record(batch)
                backoff.succeeded()
                return written
            except StoreUnavailableError as exc:
                pause = backoff.failed(exc)
                with self._cond:
                    if self._closing:
                        # Shutting down and the database is still away: the leases
                        # run out and the jobs are rescued, nothing is lost.
                        log.error(
                            "gave up recording %d outcome(s) at shutdown; their leases "
                            "will expire and they will run again",
                            len(batch),
                        )
                        return set()
                    self._cond.wait(pause)
