"""Recording outcomes in a thread of their own.

The control loop hands finished jobs over and goes straight back to claiming:
on PostgreSQL the acknowledgement of one batch and the claim of the next then
travel over two connections at once instead of one after the other. Whatever
piles up while a write is in flight goes out together in the next write.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from conveyor.worker.execution import Outcome, Running

log = logging.getLogger("conveyor.worker")

Settlement = tuple[Running, Outcome]
#: Pause before writing again after the database refused (a restart, a lock).
RETRY_PAUSE = 0.5


class Acknowledger:
    def __init__(self, write: Callable[[list[Settlement]], None], ping: Callable[[], None]) -> None:
        self._write = write
        self._ping = ping
        self._pending: list[Settlement] = []
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="conveyor-acks", daemon=True)
        self._thread.start()

    def submit(self, settle: list[Settlement]) -> None:
        if not settle:
            return
        with self._cond:
            self._pending.extend(settle)
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far is written."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._busy = True
            try:
                self._write_until_done(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write_until_done(self, batch: list[Settlement]) -> None:
        # Outcomes are retried while the database is away: their leases keep
        # them safe meanwhile, and a write after a lease ran out is simply
        # refused by the lease check (the job was rescued and runs again).
        # A refusal while the database answers is about the data instead: the
        # batch is written one outcome at a time so that one bad outcome cannot
        # hold back the others (or wedge the worker by retrying forever).
        while True:
            try:
                self._write(batch)
                return
            except Exception:
                if self._reachable():
                    self._write_one_by_one(batch)
                    return
                log.exception("could not record %d outcome(s); retrying", len(batch))
                with self._cond:
                    if self._closed:
                        return
                    self._cond.wait(RETRY_PAUSE)

    def _write_one_by_one(self, batch: list[Settlement]) -> None:
        for running, outcome in batch:
            try:
                self._write([(running, outcome)])
            except Exception as exc:
                self._write_fallback(running, outcome, exc)

    def _write_fallback(self, running: Running, outcome: Outcome, refused: Exception) -> None:
        log.error(
            "job %s: the database refused its outcome (%s): %s; failing it instead",
            running.job.id,
            outcome.kind,
            refused,
        )
        fallback = Outcome(
            "fail", error=f"the outcome could not be recorded: {refused}", retryable=False
        )
        try:
            self._write([(running, fallback)])
        except Exception:
            # The lease runs out and the job is rescued: nothing is lost.
            log.exception("job %s: could not record its failure either", running.job.id)

    def _reachable(self) -> bool:
        try:
            self._ping()
        except Exception:
            return False
        return True
