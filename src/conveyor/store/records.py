"""The records the stores pass in and out: leases, finishes, counts, selections, steps.

Plain frozen dataclasses (and the aliases and constants that go with them),
shared by the protocols (``conveyor.store.protocols``), every store and their
callers. Nothing here assumes a database.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, get_args

from conveyor.job import (
    DETAILED_STATES,
    WAITING_STATES,
    Job,
    JobState,
    decode_stored,
    storable_text,
)
from conveyor.limits import Limit


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on a running job: the fencing token names the claim."""

    id: int
    token: str


#: How an attempt ended, as ``job_finish`` records it:
#:
#: - complete: succeeded, with its result;
#: - retry: failed, queued again at ``run_at`` while attempts remain, else failed;
#: - fail: failed for good (``Fail``, a poison job, an outcome that cannot be stored);
#: - snooze: queued again at ``run_at`` without using up an attempt (``Retry``);
#: - release: handed back to queued without using up an attempt (shutdown);
#: - cancelled: the worker aborted a job whose cancel was requested;
#: - rescue: the lease expired (only if it still has): like retry, run again now;
#: - take_back: an operator's rescue of a holder known to be dead, expired or not.
#:
#: A job whose cancel was requested ends cancelled whatever the kind, unless it
#: succeeded.
FinishKind = Literal[
    "complete", "retry", "fail", "snooze", "release", "cancelled", "rescue", "take_back"
]
FINISH_KINDS: frozenset[str] = frozenset(get_args(FinishKind))


@dataclass(frozen=True, slots=True)
class Finish:
    """One outcome for ``job_finish``, keyed by the lease the job was claimed under."""

    id: int
    token: str
    kind: FinishKind
    #: complete: the result as JSON text.
    result_json: str | None = None
    #: retry, fail, rescue: the error (with its traceback).
    error: str | None = None
    #: retry, snooze: when the job runs again.
    run_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.kind not in FINISH_KINDS:
            raise ValueError(f"unknown finish kind {self.kind!r}")
        if self.error is not None:
            # Errors carry whatever an exception said: make them storable here, once.
            object.__setattr__(self, "error", storable_text(self.error))

    @classmethod
    def complete(cls, id: int, token: str, result_json: str | None) -> Finish:
        return cls(id, token, "complete", result_json=result_json)

    @classmethod
    def retry(cls, id: int, token: str, error: str, run_at: datetime) -> Finish:
        return cls(id, token, "retry", error=error, run_at=run_at)

    @classmethod
    def fail(cls, id: int, token: str, error: str) -> Finish:
        return cls(id, token, "fail", error=error)

    @classmethod
    def snooze(cls, id: int, token: str, run_at: datetime) -> Finish:
        return cls(id, token, "snooze", run_at=run_at)

    @classmethod
    def release(cls, id: int, token: str) -> Finish:
        return cls(id, token, "release")

    @classmethod
    def cancelled(cls, id: int, token: str) -> Finish:
        return cls(id, token, "cancelled")


#: The error a rescued job records.
LEASE_EXPIRED_ERROR = "worker lost: lease expired"
#: The error of a job an operator took back from its (dead) holder.
TAKEN_BACK_ERROR = "worker lost: taken back by an operator"


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    """Answer to a heartbeat for one lease that still holds."""

    id: int
    cancel_requested: bool
    #: Not renewed this time: another transaction held the job's row (PostgreSQL
    #: passes such rows over instead of waiting), whose last commit still shows
    #: the lease. Not lost: renew it again soon.
    busy: bool = False


@dataclass(frozen=True, slots=True)
class QueueStats:
    name: str
    paused: bool
    counts: dict[str, int]
    #: Seconds the oldest ready (queued, run_at <= now) job has waited; None when none is ready.
    oldest_ready_age: float | None
    #: Of the queued jobs: due later (scheduled), and due later after a failed attempt (retrying).
    scheduled: int = 0
    retrying: int = 0
    #: Of the queued jobs due later: those a wait parked (``ctx.sleep``, ``ctx.wait_for``,
    #: ``ctx.wait``), counted in scheduled or retrying too.
    parked: int = 0

    @property
    def ready(self) -> int:
        """Queued jobs that are due now."""
        return self.counts.get(JobState.QUEUED, 0) - self.scheduled - self.retrying

    def detailed_counts(self) -> dict[str, int]:
        """Jobs per detailed state (ready, scheduled, retrying, running, ...), zeros included."""
        counts = {state: self.counts.get(state, 0) for state in DETAILED_STATES}
        counts.update(ready=self.ready, scheduled=self.scheduled, retrying=self.retrying)
        return counts


@dataclass(frozen=True, slots=True)
class LimitStatus:
    """A queue's limits and how full they are, read at one moment."""

    queue: str
    #: The queue's own limit, and the limit each of its limit keys has (None: none).
    limit: Limit | None
    key_limit: Limit | None
    #: The queue's throttle, while it lasts.
    throttled_until: datetime | None
    #: Running jobs of the queue, and jobs it started in its rate's current window.
    running: int
    started: int
    #: Queued jobs of the queue that are due now.
    ready: int
    #: How many more jobs the queue's own limit lets start now (None: it sets no bound).
    room: int | None
    #: Keys that have ready jobs and no room (throttled, or at their rate or concurrency).
    keys_full: int
    #: Keys throttled now.
    keys_throttled: int
    #: Ready jobs that the limits hold back now.
    held_back: int


@dataclass(frozen=True, slots=True)
class Stats:
    queues: dict[str, QueueStats] = field(default_factory=dict)
    #: Jobs that reached a terminal state in the last minute.
    finished_last_minute: int = 0
    #: The queues that have limits (or a throttle), and how full those are.
    limits: dict[str, LimitStatus] = field(default_factory=dict)

    def count(self, state: JobState | str, queue: str | None = None) -> int:
        """Jobs in ``state`` (a state, or ready, scheduled or retrying), of a queue or of all."""
        names = [queue] if queue is not None else list(self.queues)
        chosen = [self.queues[q] for q in names if q in self.queues]
        if state in WAITING_STATES:
            return sum(q.detailed_counts()[str(state)] for q in chosen)
        return sum(q.counts.get(str(state), 0) for q in chosen)


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """How far a batch has got: its jobs counted by state, read at one moment."""

    batch: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def waiting(self) -> int:
        """Jobs waiting for other jobs (``after=``)."""
        return self.counts.get(JobState.WAITING, 0)

    @property
    def queued(self) -> int:
        return self.counts.get(JobState.QUEUED, 0)

    @property
    def running(self) -> int:
        return self.counts.get(JobState.RUNNING, 0)

    @property
    def done(self) -> int:
        """Jobs that succeeded."""
        return self.counts.get(JobState.SUCCEEDED, 0)

    @property
    def failed(self) -> int:
        return self.counts.get(JobState.FAILED, 0)

    @property
    def cancelled(self) -> int:
        return self.counts.get(JobState.CANCELLED, 0)

    @property
    def outstanding(self) -> int:
        """Jobs that may still change: waiting, queued (due or retrying) or running."""
        return self.waiting + self.queued + self.running

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> bool:
        """Every job of the batch is terminal (a batch with no jobs is not finished)."""
        return self.total > 0 and self.outstanding == 0


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker, as it registered itself (and last checked in)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    jobs_in_hand: int
    started_at: datetime
    last_seen_at: datetime
    #: What an operator asked of it (conveyor.store.worker_control): quiet, stop, concurrency.
    control: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FinishedCount:
    """How many jobs of a queue reached a terminal state in one time slot."""

    queue: str
    state: str
    #: The slot's number counted from the start of the window (0 is the oldest).
    slot: int
    count: int


#: A place in the event log: (transaction, seq). Events are counted in this
#: order: on PostgreSQL the transaction id of the writer (a transaction can
#: commit a lower seq after a higher one is visible); on SQLite, where commits
#: come in seq order, always 0.
EventOffset = tuple[int, int]


@dataclass(frozen=True, slots=True)
class EventCounts:
    """Events per (queue, kind) after an offset, and the offset they reach."""

    counts: dict[tuple[str, str], int]
    #: Ask again from here; the offset given when there were no new events.
    offset: EventOffset


@dataclass(frozen=True, slots=True)
class RunTimeBucket:
    """Jobs of a queue whose run time fell in one histogram bucket.

    ``bucket`` i holds run times above ``bounds[i-1]`` and at most ``bounds[i]``;
    ``len(bounds)`` holds those above the last bound.
    """

    queue: str
    bucket: int
    count: int
    total_seconds: float


@dataclass(frozen=True, slots=True)
class Relative:
    """A job's parent or child (see ``WorkflowStore``), with the edge between them."""

    #: The parent's (or child's) id.
    id: int
    #: The job; None for a parent deleted (on Redis also: dropped) since the edge
    #: was written: the edge stays while its child does, so that the child knows
    #: the parent is gone rather than missing it.
    job: Job | None
    #: The state the parent had ended in when the edge was resolved ('deleted' or
    #: 'dropped' once it is gone); None while the parent has not ended.
    resolved: str | None


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A stored workflow: its id, name, number of jobs and when it was enqueued."""

    id: str
    name: str
    jobs: int
    created_at: datetime


# --- operating in bulk --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Purge:
    """The finished jobs a purge deletes (``job_purge_where``) or counts
    (``job_purge_count``): those in ``states`` (final ones) that finished before
    ``finished_before``, of ``queue`` (None: every queue). ``by_policy``: a queue's
    age rule, which passes over the jobs whose own rule (``retain=``) names the
    state they ended in; an operator's purge takes them too."""

    finished_before: datetime
    states: Sequence[str]
    queue: str | None = None
    by_policy: bool = False


@dataclass(frozen=True, slots=True)
class Page:
    """A page of a newest-first listing (``job_select``): up to ``limit`` jobs with an
    id below ``before_id`` (None: from the newest). The next page starts below
    the last id of this one."""

    limit: int = 100
    before_id: int | None = None


#: The newest 100 jobs.
FIRST_PAGE = Page()


@dataclass(frozen=True, slots=True)
class JobSelection:
    """Which jobs a listing, a count or a bulk action applies to: every field that is set.

    ``state`` is a state or one of the kinds of queued job (ready, scheduled,
    retrying). ``error`` matches text in the last error (case-insensitive for
    ASCII); ``worker`` is the worker (or consumer) id that claimed the job;
    ``key`` the idempotency key, ``limit_key`` the key a per-key limit counts
    it under; ``args`` text in the arguments or keyword arguments as JSON
    (case-insensitive for ASCII), searched in the newest jobs only (see
    ``conveyor.store.selection.ARGS_SEARCH_SPAN``).
    """

    state: str | None = None
    queue: str | None = None
    task: str | None = None
    group: str | None = None
    batch: str | None = None
    error: str | None = None
    worker: str | None = None
    ids: tuple[int, ...] | None = None
    key: str | None = None
    limit_key: str | None = None
    args: str | None = None

    @property
    def empty(self) -> bool:
        """Selects every job."""
        return all(getattr(self, f.name) is None for f in fields(self))


@dataclass(frozen=True, slots=True)
class LimitChange:
    """What ``limit_set`` changes: the queue's own limit, or with ``per_key`` its
    keys' limit, set to ``limit`` (None: cleared). The other scope's limit and
    any throttle stay, and so do the parts of this scope named in ``keep``
    ("rate", "concurrency")."""

    queue: str
    limit: Limit | None
    per_key: bool = False
    keep: Collection[str] = ()


# --- exactly-once effects -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """A durable step of a job (``ctx.step``): its name, result and when it ran."""

    name: str
    #: The step's result as JSON text (decoded by ``result``).
    result_json: str
    #: The attempt that ran it.
    attempt: int
    started_at: datetime
    finished_at: datetime

    @property
    def result(self) -> Any:
        return decode_stored(self.result_json, f"the result of step {self.name!r}")


@dataclass(frozen=True, slots=True)
class NewStep:
    """A step's result to record (``StepStore.step_record``): the attempt that ran
    it is the lease's, and it finishes when it is recorded."""

    name: str
    #: The result as JSON text.
    result_json: str
    started_at: datetime
