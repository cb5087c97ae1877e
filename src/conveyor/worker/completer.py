"""Recording outcomes: the one way an attempt's end becomes a row.

``Completer.record`` writes outcomes through ``Store.job_finish``; the worker,
``consume`` and the testing helpers all use it. The worker hands it outcomes
through ``CompleterThread``, which writes whatever has piled up in one batch
while the control loop goes straight back to claiming (on PostgreSQL the
acknowledgement of one batch and the claim of the next then travel over two
connections at once). On a store that can (``FinishFetchStore``: Redis) a batch
also claims the next jobs for the slots it frees, in the same call: the worker
says how many with each submit, and gets the jobs back with the batch's answer.

Two kinds of trouble, told apart: a database that is away (a restart, a
dropped connection, a file locked by another process past the busy timeout, a
full disk: ``StoreUnavailableError``) delays the write, which is retried with backoff
while the worker keeps the leases alive; a database that refuses the data
itself fails that job alone, with the refusal as its error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from conveyor.changes import ChangeHub
from conveyor.encryption import PayloadCodec
from conveyor.errors import StoreUnavailableError
from conveyor.job import Job, JobState
from conveyor.logs import job_fields
from conveyor.pacing import DutyBackoff
from conveyor.store.finish_fetch import FetchNext, FinishFetchStore
from conveyor.store.protocols import JobStore
from conveyor.worker.executor import Outcome, Running

log = logging.getLogger("conveyor.worker")

Settlement = tuple[Running, Outcome]
#: Longest pause between two writes of the same outcomes while the database is away.
RETRY_CEILING = 2.0
#: First and longest pause before an outcome whose job's row another transaction held
#: is written again.
BUSY_PAUSE = 0.02
BUSY_PAUSE_CEILING = 1.0
#: How long ``Completer.record`` (consume, inline mode) tries such an outcome again.
BUSY_GIVE_UP = 60.0


class Completer:
    def __init__(
        self, store: JobStore, changes: ChangeHub, codec: PayloadCodec | None = None
    ) -> None:
        self._store = store
        self._changes = changes
        #: Seals results before they are written (encryption at rest), when given.
        self._codec = codec

    def record(self, settle: Sequence[Settlement]) -> set[int]:
        """Write the outcomes; return the ids whose lease still held.

        An outcome whose job's row another transaction holds (a handler's
        ``ctx.complete`` committed after it returned) is written again after a
        short pause, until that transaction has ended: for ``consume`` and inline
        mode, which hold one job and have nothing else to do meanwhile, for up
        to ``BUSY_GIVE_UP`` seconds. Raises as ``record_some`` does.
        """
        written, busy = self.record_some(settle)
        pause = BUSY_PAUSE
        give_up = time.monotonic() + BUSY_GIVE_UP
        while busy:
            if time.monotonic() > give_up:
                # The way out of a transaction that never ends: the outcome is not
                # written, the lease runs out, and the job is rescued.
                log.warning(
                    "gave up recording %d outcome(s): another transaction held their "
                    "jobs for over %gs",
                    len(busy),
                    BUSY_GIVE_UP,
                )
                break
            time.sleep(pause)
            pause = min(pause * 2, BUSY_PAUSE_CEILING)
            more, busy = self.record_some(busy)
            written |= more
        return written

    def record_some(self, settle: Sequence[Settlement]) -> tuple[set[int], list[Settlement]]:
        """Write the outcomes; return the ids whose lease still held, and the outcomes left
        for later because another transaction held their job's row.

        Raises StoreUnavailableError while the database is away (nothing is
        written then). A batch the database refuses is written one outcome at a
        time, so one bad outcome cannot hold back the others, and an outcome it
        refuses becomes a failure that names the refusal.
        """
        if not settle:
            return set(), []
        try:
            written, busy, _ = self._write(settle)
        except StoreUnavailableError:
            raise
        except Exception as exc:
            if len(settle) == 1:
                written, busy = self._write_fallback(settle[0], exc)
            else:
                written, busy = set(), []
                for one in settle:
                    more, later = self.record_some([one])
                    written |= more
                    busy += later
        return written, busy

    def record_fetching(
        self, settle: Sequence[Settlement], fetch: FetchNext
    ) -> tuple[set[int], list[Settlement], list[Job]]:
        """``record_some``, and the jobs ``fetch`` claims in the same call (none on a store
        without ``FinishFetchStore``, or when the batch is refused and written one by one)."""
        if not settle or not isinstance(self._store, FinishFetchStore):
            return (*self.record_some(settle), [])
        try:
            return self._write(settle, fetch)
        except StoreUnavailableError:
            raise
        except Exception:
            return (*self.record_some(settle), [])  # each alone; the refusal is told there

    def _write(
        self, settle: Sequence[Settlement], fetch: FetchNext | None = None
    ) -> tuple[set[int], list[Settlement], list[Job]]:
        for running, _ in settle:
            # Progress waiting for its turn (written at most once a second) goes
            # first, under the lease it still holds: a job ends showing the last
            # progress it reported, not one from up to a second before. Not after
            # ctx.complete: the job's row is the handler's transaction's (held
            # until it ends, then no longer running), and the write would wait.
            if not running.context.completed_in_transaction and not running.context.parked:
                running.context.flush_progress()
        # A wait that parked its job (ctx.wait_for) ended the attempt in the store's
        # own statement already: nothing more to write.
        parked = {running.id for running, _ in settle if running.context.parked}
        finishes = [
            outcome.finish(running.id, running.token)
            for running, outcome in settle
            if running.id not in parked
        ]
        if self._codec is not None:
            seal = self._codec.seal_result
            finishes = [replace(f, result_json=seal(f.result_json)) for f in finishes]
        fetched: list[Job] = []
        if fetch is not None and isinstance(self._store, FinishFetchStore):
            ids, fetched = self._store.job_finish_fetch(finishes, fetch)
            written = set(ids) | parked
        else:
            written = set(self._store.job_finish(finishes)) | parked
        busy: list[Settlement] = []
        if len(written) < len(settle):
            done, busy_ids = self._refused(settle, written)
            written |= done
            busy = [one for one in settle if one[0].id in busy_ids]
        if written:  # wakes waiters in this process at once
            self._changes.publish("done", ",".join(map(str, sorted(written))))
        return written, busy, fetched

    def _refused(
        self, settle: Sequence[Settlement], written: set[int]
    ) -> tuple[set[int], set[int]]:
        """Of the attempts the finish did not end, those that succeeded by ``ctx.complete``,
        and those whose row another transaction held (the finish passes such rows over).

        Told apart from a lost lease by the job itself. Succeeded, and by no
        later attempt: the handler's transaction committed the job's success,
        so nothing more is recorded, and the attempt counts as succeeded.
        Still running under this attempt's lease: the finish met the row held
        (by the handler's own transaction not yet committed, or a cancel or a
        rescue at that moment), so it is written again later. A read on the
        path of refused finishes only.
        """
        asked = {running.id: running for running, _ in settle if running.id not in written}
        done: set[int] = set()
        busy: set[int] = set()
        for job in self._store.job_get_many(list(asked)):
            running = asked[job.id]
            if job.state == JobState.RUNNING and job.lease_token == running.token:
                busy.add(job.id)
            elif (
                running.context.completed_in_transaction
                and job.state == JobState.SUCCEEDED
                and job.attempts == running.job.attempts
            ):
                running.recorded = Outcome("complete", result_json=job.result_json)
                done.add(job.id)
        return done, busy

    def _write_fallback(
        self, settlement: Settlement, refused: Exception
    ) -> tuple[set[int], list[Settlement]]:
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
            written, busy, _ = self._write([(running, Outcome("fail", error=error))])
            return written, busy
        except StoreUnavailableError:
            raise
        except Exception:
            # The lease runs out and the job is rescued: nothing is lost.
            log.exception(
                "job %s: could not record its failure either",
                running.id,
                extra=job_fields(running.job),
            )
            return set(), []


#: Told of each written batch: the attempts, the ids whose lease held, the jobs the
#: batch claimed, and how many it was asked to claim (the slots promised to it).
OnRecorded = Callable[[list[Running], set[int], list[Job], int], None]


class CompleterThread:
    """The worker's completer: batches outcomes in a thread, retrying while the database is away."""

    def __init__(
        self, completer: Completer, on_recorded: OnRecorded, fetch: FetchNext | None = None
    ) -> None:
        self._completer = completer
        self._on_recorded = on_recorded
        #: What a batch claims for the slots it frees (its limit set per batch); None: nothing.
        self._fetch = fetch
        self._pending: list[Settlement] = []
        #: Jobs the pending outcomes' batch is asked to claim.
        self._fetch_asked = 0
        #: Outcomes whose job's row another transaction held, written again at _later_at.
        self._later: list[Settlement] = []
        self._later_at = 0.0
        self._busy = False
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="conveyor-completer", daemon=True)
        self._thread.start()

    def submit(self, settle: list[Settlement], fetch: int = 0) -> None:
        """Write these outcomes soon; with ``fetch``, claim up to as many jobs with them."""
        if not settle:
            return
        with self._cond:
            self._pending.extend(settle)
            self._fetch_asked += fetch
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Closed: what is submitted now is never written (``record_now`` writes it)."""
        return self._closing

    def record_now(self, settle: list[Settlement]) -> set[int]:
        """Write outcomes in the caller's thread (after ``close``): the ids whose lease held."""
        return self._completer.record(settle)

    def close(self, timeout: float) -> bool:
        """Write what was submitted, for up to ``timeout``; True when nothing is left unwritten."""
        with self._cond:
            flushed = self._cond.wait_for(
                lambda: not self._pending and not self._later and not self._busy, timeout
            )
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=1.0)
        return flushed

    def _run(self) -> None:
        busy_rounds = 0
        while True:
            with self._cond:
                while not (self._pending or (self._later and time.monotonic() >= self._later_at)):
                    if self._closing:
                        if self._later:
                            log.error(
                                "gave up recording %d outcome(s) at shutdown: another "
                                "transaction held their jobs; they end as it decides, or "
                                "run again once their leases expire",
                                len(self._later),
                            )
                        return
                    wait = self._later_at - time.monotonic() if self._later else None
                    self._cond.wait(wait)
                batch, self._later, self._pending = self._later + self._pending, [], []
                asked, self._fetch_asked = self._fetch_asked, 0
                self._busy = True
            later: list[Settlement] = []
            told = False
            try:
                written, later, fetched = self._write_until_done(batch, asked)
                left = {id(running) for running, _ in later}
                decided = [running for running, _ in batch if id(running) not in left]
                told = True
                self._on_recorded(decided, written, fetched, asked)
            except Exception:  # a bug of ours: say so, and go on with the next batch
                log.exception("recording %d outcome(s) failed", len(batch))
                if not told and asked:  # the slots promised to the fetch are free again
                    self._on_recorded([], set(), [], asked)
            finally:
                with self._cond:
                    # Rows held by another transaction: written again after a pause
                    # that grows while they stay held (the other outcomes go on).
                    busy_rounds = busy_rounds + 1 if later else 0
                    self._later = later
                    pause = min(BUSY_PAUSE * 2 ** min(busy_rounds, 16), BUSY_PAUSE_CEILING)
                    self._later_at = time.monotonic() + pause
                    self._busy = False
                    self._cond.notify_all()

    def _write_until_done(
        self, batch: list[Settlement], fetch: int
    ) -> tuple[set[int], list[Settlement], list[Job]]:
        backoff = DutyBackoff(f"recording {len(batch)} outcome(s)", log, ceiling=RETRY_CEILING)
        while True:
            try:
                if fetch and self._fetch is not None:
                    asked = replace(self._fetch, limit=fetch)
                    recorded = self._completer.record_fetching(batch, asked)
                else:
                    recorded = (*self._completer.record_some(batch), [])
                backoff.succeeded()
                return recorded
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
                        return set(), [], []
                    self._cond.wait(pause)
