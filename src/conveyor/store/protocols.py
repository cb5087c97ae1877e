"""The store protocols: one core contract and the capabilities beside it.

Methods are named noun_verb after domain actions. Every time-dependent
method takes ``now`` so that tests can fix the clock. Methods that act on
running jobs take leases ``(id, lease_token)`` and return the ids they
actually changed: an id missing from the answer means the caller's lease was
stale (the job was rescued, cancelled or finished by someone else) and its
outcome was not recorded.

Nothing here assumes SQL: a store on another kind of database implements the
same methods. The records they take and return are in ``conveyor.store.records``;
the checks that a store has a capability in ``conveyor.store.capabilities``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from conveyor.job import (
    Event,
    Job,
    NewJob,
)
from conveyor.limits import QueueLimits
from conveyor.store.records import (
    FIRST_PAGE,
    BatchStatus,
    EventCounts,
    EventOffset,
    Finish,
    FinishedCount,
    JobSelection,
    Lease,
    LeaseStatus,
    LimitChange,
    LimitStatus,
    NewStep,
    Page,
    Purge,
    Relative,
    RunTimeBucket,
    Stats,
    Step,
    WorkerInfo,
    WorkflowInfo,
)


class Subscription(Protocol):
    def close(self) -> None: ...


#: Called from a background thread as ``on_change(channel, payload)``. Channels:
#: "jobs" (payload: a queue with new ready work), "cancel" (payload: a job id),
#: "any" (something changed; the store cannot say what), and "reconnected"
#: (notifications may have been missed: look at everything again).
ChangeCallback = Callable[[str, str], None]


@runtime_checkable
class JobStore(Protocol):
    """The core: what a worker and ``consume`` need of a store, and all that every store must do.

    The job's life (insert, claim, heartbeat, finish, progress, rescue, when
    to claim next), the workers list, the leader lease, periodic ticks and
    change notifications. The state machine it implements is described in
    docs/architecture.md. The other protocols below are capabilities a store
    may add; callers check them (``conveyor.store.capabilities``) and refuse
    clearly, up front, what a store cannot do.
    """

    #: A short description for errors and logs (never includes a password).
    description: str

    def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""
        ...

    def schema_version(self) -> int: ...

    def close(self) -> None: ...

    def ping(self) -> None:
        """Raise StoreUnavailableError when the database cannot be reached."""
        ...

    def job_insert_many(
        self, jobs: Sequence[NewJob], now: datetime, connection: Any = None
    ) -> list[Job]:
        """Insert jobs in one transaction; return one Job per input, in order.

        A job with a key that matches an existing job (a live one for
        ``unique="live"``, any not yet purged for ``unique="forever"``) is not
        inserted: the existing job is returned in its place. With
        ``connection``, the insert runs in the caller's open transaction and
        is not committed here.
        """
        ...

    def job_get(self, job_id: int) -> Job | None: ...

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]: ...

    def next_run_in(
        self, queues: Sequence[str], now: datetime | None = None, group: str | None = None
    ) -> float | None:
        """Seconds until a claim on ``queues`` (and ``group``) could start a job it cannot now.

        That is when the next queued job that is not yet due becomes due, or,
        for a queue with limits, when a throttle ends or a full rate window
        lets the next job through; 0 when a limited queue would let a ready job
        through already (a claim that lost the race for the limit took none).
        Jobs already due that a busy group, a pause or a full concurrency limit
        holds are not counted (a job that ends, or a resume, wakes the workers),
        nor jobs of paused queues: a worker sleeps until this, or a wake-up,
        instead of claiming again at once. Measured on the store's clock
        (``now`` None), so a worker's own clock cannot make it early.
        """
        ...

    def job_claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime | None = None,
        group: str | None = None,
    ) -> list[Job]:
        """Atomically move up to ``limit`` ready jobs to running under a fresh lease token.

        ``now`` None: the store's clock, which judges ``run_at`` and sets the
        lease's expiry (on PostgreSQL the server's, so that skew between
        worker machines cannot expire a healthy lease early).

        Ready: queued, ``run_at <= now``, queue not paused, and (for a job in
        a group) the oldest queued job of a group with no running job.
        Higher priority first, then oldest. With ``group``, only that group.
        """
        ...

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime | None = None
    ) -> list[LeaseStatus]:
        """Extend the leases that still hold; say which of them have a cancel pending.

        A lease left out of the answer no longer holds. Waits for no row: one
        that another transaction holds is answered as ``busy`` (not renewed this
        time) while the last commit still shows it under its lease.
        """
        ...

    def job_finish(self, finishes: Sequence[Finish], now: datetime | None = None) -> list[int]:
        """Record outcomes of running jobs, each checked against its lease, in one transaction.

        Returns the ids it changed: an id missing from the answer means that
        lease no longer held (the job was rescued, cancelled or finished by
        someone else), or, for a rescue, that it has not expired, or that
        another transaction held the job's row (PostgreSQL passes such rows
        over instead of waiting: the job is then still running under the
        lease, and the finish may be tried again). Each change
        appends its events (and, where the store has them, notifications) in
        the same transaction. ``now`` None: the store's clock.
        """
        ...

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool: ...

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        """Requeue (or fail, when out of attempts) running jobs whose lease expired.

        Reads the expired leases, then ends them with ``job_finish`` kind
        "rescue": a compare-and-set on (id, lease_token) that also re-checks
        the expiry, so a worker that renews or finishes in the same instant
        either wins entirely or loses entirely. Waits for no other
        transaction's row (PostgreSQL passes such a job over: the next round
        tries it again); on SQLite, a round gives up when a write waited long
        for the write lock, so that renewals that waited as well come first.
        """
        ...

    def periodic_enqueue(self, name: str, tick: datetime, job: NewJob, now: datetime) -> bool:
        """Enqueue ``job`` for tick ``tick`` of periodic task ``name``, once.

        The last tick enqueued is kept in the store, in the transaction that
        inserts the job: a tick at or before it is refused (False), whatever
        was purged, restarted or changed leader since.
        """
        ...

    def periodic_last_ticks(self) -> dict[str, datetime]:
        """The last tick enqueued of each periodic task, by name."""
        ...

    def queue_paused(self) -> set[str]: ...

    def subscribe(self, on_change: ChangeCallback) -> Subscription:
        """Watch for changes made by other processes (see ChangeCallback)."""
        ...

    def worker_register(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: list[str],
        concurrency: int,
        now: datetime,
    ) -> None: ...

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> str | None:
        """Mark the worker seen; what an operator asked of it (its control, JSON: quiet,
        stop, concurrency), None for nothing or a worker not registered."""
        ...

    def worker_unregister(self, worker_id: str) -> None: ...

    def worker_prune(self, last_seen_before: datetime) -> int:
        """Forget workers not seen since the time (they died without unregistering)."""
        ...

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        """Take or renew the lease on leadership ``name``; False while another holds it."""
        ...

    def leader_release(self, name: str, holder: str) -> None: ...

    def schema_latest(self) -> int:
        """The schema version this code's migrations reach (what ``migrate()`` would give)."""
        ...


@runtime_checkable
class OperatorStore(Protocol):
    """Operator actions and listings: what the CLI, the dashboard and the App's operations need."""

    def event_list(self, job_id: int) -> list[Event]:
        """A job's history, oldest first."""
        ...

    def stats(self, now: datetime) -> Stats: ...

    def batch_status(self, batch: str) -> BatchStatus:
        """The jobs of a batch counted by state (purged jobs are no longer counted)."""
        ...

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        """Queue again up to ``limit`` failed jobs (of ``queue``, or of all queues), attempts reset.

        Only jobs that failed at or before ``failed_before``: a caller that loops
        until nothing is left passes the time it started, so a job failing again
        meanwhile is not retried twice. A keyed job is retried only when it is the
        newest job of its key and no live job holds the key. Returns the ids queued.
        """
        ...

    def queue_pause(self, queue: str, now: datetime) -> None: ...

    def queue_resume(self, queue: str, now: datetime) -> None: ...

    def worker_list(self) -> list[WorkerInfo]: ...

    def job_select(
        self, selection: JobSelection, now: datetime, page: Page = FIRST_PAGE
    ) -> list[Job]:
        """Jobs matching the selection, newest first, a page at a time (keyset pages).

        The one way jobs are listed. ``now`` tells ready, scheduled and retrying
        jobs apart.
        """
        ...

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        """Jobs matching the selection per detailed state (ready, scheduled, ..., cancelled)."""
        ...

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Queue the failed or cancelled jobs among ``job_ids`` again, attempts reset.

        A keyed job goes back only when it is the newest job of its key and no
        live job holds the key. Returns the ids queued.
        """
        ...

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Cancel the queued jobs among ``job_ids``; ask the workers of the running ones to stop.

        Returns the ids changed (cancelled, or with a cancel newly requested).
        """
        ...

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        """Delete the jobs among ``job_ids`` that are not running, with their events."""
        ...

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Make the queued jobs among ``job_ids`` that are due later due now."""
        ...

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Rescue the running jobs among ``job_ids`` now, without waiting for their leases.

        For jobs whose worker or consumer is known to be dead: as a rescue, each
        is queued again (failed when out of attempts, cancelled when a cancel was
        pending); a late outcome from the old holder is refused by its stale token.
        """
        ...

    def job_purge_where(self, purge: Purge, limit: int = 10_000) -> int:
        """Delete up to ``limit`` of the jobs ``purge`` names, oldest first, with their events."""
        ...

    def job_purge_count(self, purge: Purge) -> int:
        """How many jobs ``job_purge_where`` would delete in all (a dry run)."""
        ...

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        """Delete up to ``limit`` jobs of ``queue`` in ``states`` (final ones) beyond the
        ``keep`` newest of them (by id): retention by count, of all final states or per state."""
        ...

    def queue_delete(self, queue: str) -> None:
        """Forget a queue's settings (its pause); its jobs are deleted apart."""
        ...


@runtime_checkable
class InsightStore(Protocol):
    """The dashboard's and the metrics' figures, and the event feed of the data pipeline."""

    def event_since(self, seq: int, limit: int) -> list[Event]:
        """Events with seq > ``seq``, in seq order: the feed of the data pipeline."""
        ...

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        """Jobs that reached a terminal state since ``since``, per queue, state and slot."""
        ...

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        """Count the events after ``after`` per queue and kind.

        A caller that goes on from the returned offset counts every event once,
        including, on PostgreSQL, one whose transaction commits a lower seq
        after a higher one was counted (it is counted once it has committed).
        """
        ...

    def queue_names(self) -> list[str]:
        """Every queue that holds jobs or has been paused, by name."""
        ...

    def event_offset(self) -> EventOffset:
        """The offset of the newest event (``(0, 0)`` when there is none): count from here."""
        ...

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        """Run times of the jobs that succeeded or failed in (after, until], bucketed."""
        ...


@runtime_checkable
class FlowControlStore(Protocol):
    """Rate and concurrency limits and throttles, set and read (claims enforce them in the core)."""

    # Enforced by job_claim itself (one statement on PostgreSQL, one transaction
    # on SQLite, one script on Redis): a claim never starts more jobs than a
    # queue's and its keys' limits leave room for, counted at that claim.
    #
    # Enforced by job_claim itself (one statement on PostgreSQL, one transaction
    # on SQLite): a claim never starts more jobs than a queue's and its keys'
    # limits leave room for, counted at that claim.
    def limit_set(self, change: LimitChange, now: datetime) -> QueueLimits | None:
        """Set (or, with None, clear) a queue's own limit or its keys' (see ``LimitChange``).

        Returns what the queue has now (None: nothing). Workers obey it from
        their next claim.
        """
        ...

    def limit_get(self, queue: str) -> QueueLimits | None:
        """The queue's limits and throttle as stored (None: it has none)."""
        ...

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        """Hold the queue (or one of its limit keys) back for ``seconds`` from now; 0 lifts it.

        A throttle is extended, never shortened, by another. Returns when it ends,
        on the store's clock (``now`` None).
        """
        ...

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        """Every queue's limits and how full they are, by queue name."""
        ...

    def limit_prune(self, now: datetime) -> None:
        """Maintenance: forget starts out of every window, ended throttles, empty limit rows."""
        ...


@runtime_checkable
class TransactionalStore(Protocol):
    """Enqueue inside the caller's own open transaction (``enqueue(..., connection=conn)``)."""

    #: What the caller's connection must be, for messages ("a psycopg Connection").
    transaction_connection: str


@runtime_checkable
class DurabilityReport(Protocol):
    """A store whose durability depends on the server's settings says what they are (Redis)."""

    def durability(self) -> tuple[str, str | None]:
        """What persists the data, and a warning when it may lose acknowledged jobs."""
        ...


@runtime_checkable
class WorkflowStore(Protocol):
    """Jobs that wait for other jobs: their edges read back (the insert and the finish
    keep them in the core: ``NewJob.after``), and declared workflows."""

    def job_parents(self, job_id: int) -> list[Relative]:
        """The jobs ``job_id`` waits for, by id."""
        ...

    def job_children(self, job_id: int) -> list[Relative]:
        """The jobs that wait for ``job_id``, by id."""
        ...

    def job_workflow(self, job_id: int) -> str | None:
        """The id of the declared workflow a job belongs to, if any."""
        ...

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        """Insert a workflow's jobs (``after_new`` linking them) and its record, atomically.

        When a workflow with this id is stored already, nothing is written: its
        jobs are returned, and True. Otherwise the new jobs (one per input, as
        ``job_insert_many``), and False.
        """
        ...

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None: ...

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        """The newest workflows first."""
        ...

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        """The jobs of a workflow, by id."""
        ...

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        """The jobs of a workflow counted by state."""
        ...

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        """(child, parent, resolved) of every edge onto a job of the workflow."""
        ...


@runtime_checkable
class HoldStore(Protocol):
    """Holding single queued jobs back, so that no worker claims them, and letting them go."""

    def job_hold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Hold the queued jobs among ``job_ids`` (not running or finished ones); the ids held."""
        ...

    def job_unhold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        """Let the held jobs among ``job_ids`` go, due at the run_at they had (or now)."""
        ...

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        """Ids of held jobs (of ``queue``, or of all), newest first, below ``before_id``."""
        ...


@runtime_checkable
class OutcomeStore(Protocol):
    """Outcome readers: finished jobs whose result is not yet processed, marked once each."""

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        """Ids of jobs in ``states`` (final ones) finished at ``since`` or later whose
        outcome has no processed mark for that finish; oldest finish first."""
        ...

    def job_mark_processed(self, job_id: int) -> bool:
        """Mark a finished job's outcome processed: True for exactly one caller per finish
        (a compare-and-set); False when marked already, or when the job is not finished."""
        ...


@runtime_checkable
class SqlStore(Protocol):
    """A store on an SQL database, whose tables other layers build on (the Spark data source)."""

    #: "sqlite" or "postgresql".
    sql_dialect: str

    def job_delete_terminal(self, job_ids: Sequence[int], finished_before: datetime) -> list[int]:
        """Delete the given jobs (and their events) that are terminal and finished before the time.

        The Spark archive's delete: it names exactly the jobs it has written. A job
        retried since is live again (or finished later) and is left alone.
        Returns the ids deleted.
        """
        ...


@runtime_checkable
class LocalFileStore(Protocol):
    """A store in one file on this machine: every process that shares it runs on this machine."""

    @property
    def database_file(self) -> Path: ...


@runtime_checkable
class Store(JobStore, OperatorStore, InsightStore, FlowControlStore, WorkflowStore, Protocol):
    """A store with every capability but the optional ones above: what the three stores are."""


@runtime_checkable
class StepStore(Protocol):
    """A job's durable steps: recorded under the attempt's lease, read by any later attempt."""

    def step_list(self, job_id: int) -> list[Step]:
        """The steps the job recorded, in the order they finished (none for an unknown job)."""
        ...

    def step_record(self, lease: Lease, step: NewStep, now: datetime | None = None) -> Step | None:
        """Record a step's result while ``lease`` holds; the step as recorded.

        A step of that name recorded already is kept and returned (one name,
        one result, whichever attempt recorded it first). None when the lease
        no longer holds: nothing is written.
        """
        ...


@runtime_checkable
class TransactionalCompletion(Protocol):
    """Complete a running job inside the caller's open transaction (``ctx.complete(conn)``)."""

    #: What the caller's connection must be, for messages ("a psycopg Connection").
    transaction_connection: str

    def job_complete_in(
        self, lease: Lease, result_json: str, connection: Any, now: datetime | None = None
    ) -> bool:
        """Record the job's success on ``connection``, in its open transaction, not committed.

        Fenced by the lease: False when it no longer holds (nothing written).
        The job's outcome, its event and notifications become durable (and
        visible) when the caller commits, and vanish if it rolls back.
        """
        ...
