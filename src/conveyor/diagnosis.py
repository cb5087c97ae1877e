"""Why a job that could run is not running: each thing that holds it back, named.

Read from what the stores already keep (the job's row, paused queues, limits
and their usage, one limit key's usage, the group's running job, the parents'
edges, the live workers), a few reads at one moment; nothing here decides what
a claim does: the claim's own statement or script does that. What this says is
a reading for people (``app.why``, the job page, ``conveyor jobs show``), true
when it was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor.job import Job, JobState
from conveyor.limits import fullness_words, window_words
from conveyor.logs import spelled_duration
from conveyor.store.limit_keys import LimitKeyStore
from conveyor.store.protocols import FlowControlStore, JobStore, OperatorStore, WorkflowStore
from conveyor.store.records import JobSelection, LimitStatus, Page

#: The kinds of reason, in the order they are given (what an operator would
#: undo first comes first).
REASON_KINDS = (
    "held", "waiting_for_parents", "not_due", "paused", "throttled", "concurrency", "rate",
    "key_throttled", "key_concurrency", "key_rate", "group_busy", "no_worker",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reason:
    """One thing that holds a job back."""

    #: One of REASON_KINDS.
    kind: str
    #: The reason in words: ``queue 'mail' is paused``.
    text: str
    #: When it ends by itself, if it does (a throttle, a due time).
    until: datetime | None = None
    #: The limit key it is about (key_* kinds).
    limit_key: str | None = None
    #: The jobs it is about: the group's running job, the parents waited for.
    job_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Why:
    """Why job ``job_id`` is not running, read at ``at``.

    ``reasons`` is empty for a job that nothing holds back (a worker should
    claim it at its next round) and for one that is running or has ended
    (``waiting`` False).
    """

    job_id: int
    state: str
    at: datetime
    reasons: tuple[Reason, ...]

    @property
    def waiting(self) -> bool:
        """The job has not started: waiting for parents, or queued (due, held or later)."""
        return self.state in (JobState.WAITING, JobState.QUEUED)

    def summary(self) -> str:
        """The reasons in one line, or what the job is doing instead."""
        if not self.waiting:
            return f"not waiting to run: it is {self.state}"
        if not self.reasons:
            return "nothing holds it back: a worker claims it at its next round"
        return "; ".join(reason.text for reason in self.reasons)


def when_words(until: datetime, now: datetime) -> str:
    """``22:40:05 UTC (in 3 min)``; the date too when it is not today's."""
    shape = "%H:%M:%S" if until.date() == now.date() else "%Y-%m-%d %H:%M:%S"
    moment = f"{until:{shape}} UTC"
    return f"{moment} (in {spelled_duration((until - now).total_seconds())})"


def diagnose(store: JobStore, job: Job, now: datetime, *, silent_after: timedelta) -> Why:
    """What holds ``job`` back now. ``silent_after``: a worker silent longer is not counted
    as live."""
    reasons: list[Reason] = []
    if job.state == JobState.WAITING:
        reasons.extend(_parents(store, job))
    elif job.state == JobState.QUEUED:
        if job.held:
            reasons.append(Reason("held", "held by an operator: release it (unhold) to run it"))
            return Why(job.id, str(job.state), now, tuple(reasons))
        due = job.run_at <= now
        if not due:
            reasons.append(
                Reason("not_due", f"not due until {when_words(job.run_at, now)}", until=job.run_at)
            )
        if job.queue in store.queue_paused():
            reasons.append(Reason("paused", f"queue {job.queue!r} is paused"))
        if due:
            # Limits and groups hold a job back only at the moment it could start.
            reasons.extend(_limits(store, job, now))
            reasons.extend(_group(store, job, now))
    else:
        return Why(job.id, str(job.state), now, ())
    reasons.extend(_workers(store, job, now, silent_after))
    return Why(job.id, str(job.state), now, tuple(reasons))


def _parents(store: JobStore, job: Job) -> list[Reason]:
    if not isinstance(store, WorkflowStore):
        return []
    waited = tuple(edge.id for edge in store.job_parents(job.id) if edge.resolved is None)
    if not waited:
        return []
    shown = ", ".join(str(i) for i in waited[:10]) + (", ..." if len(waited) > 10 else "")
    noun = "job" if len(waited) == 1 else f"{len(waited)} jobs"
    return [Reason("waiting_for_parents", f"waiting for {noun} to end: {shown}", job_ids=waited)]


def _limits(store: JobStore, job: Job, now: datetime) -> list[Reason]:
    if not isinstance(store, FlowControlStore) or store.limit_get(job.queue) is None:
        return []  # the usual case costs one cheap read
    status = next((s for s in store.limit_status(now) if s.queue == job.queue), None)
    if status is None:
        return []
    reasons = _queue_limit(status, now)
    if job.limit_key is not None and isinstance(store, LimitKeyStore):
        reasons.extend(_key_limit(store, status, job.limit_key, now))
    return reasons


def _queue_limit(status: LimitStatus, now: datetime) -> list[Reason]:
    queue = status.queue
    if status.throttled_until is not None:
        until = status.throttled_until
        text = f"queue {queue!r} is throttled until {when_words(until, now)}"
        return [Reason("throttled", text, until=until)]
    limit = status.limit
    if limit is None or status.room != 0:
        return []
    reasons = []
    if limit.concurrency is not None and status.running >= limit.concurrency:
        text = (
            f"queue {queue!r} is at its concurrency limit: "
            + fullness_words(limit, status.running, status.started)[0]
        )
        reasons.append(Reason("concurrency", text))
    if limit.rate is not None and status.started >= limit.rate.count:
        text = (
            f"queue {queue!r} is at its rate limit ({limit.rate}): {status.started:,} started "
            f"in the last {window_words(limit.rate.per)}"
        )
        reasons.append(Reason("rate", text))
    return reasons


def _key_limit(store: LimitKeyStore, status: LimitStatus, key: str, now: datetime) -> list[Reason]:
    if status.key_limit is None and status.keys_throttled == 0:
        return []
    usage = store.limit_key_usage(status.queue, key, now)
    named = f"limit key {key!r} of queue {status.queue!r}"
    if usage.throttled_until is not None:
        until = usage.throttled_until
        text = f"{named} is throttled until {when_words(until, now)}"
        return [Reason("key_throttled", text, until=until, limit_key=key)]
    limit = status.key_limit
    reasons = []
    if limit is not None and limit.concurrency is not None and usage.running >= limit.concurrency:
        text = (
            f"{named} is at its concurrency limit: {usage.running:,} running; "
            f"limit {limit.concurrency:,}"
        )
        reasons.append(Reason("key_concurrency", text, limit_key=key))
    if limit is not None and limit.rate is not None and usage.started >= limit.rate.count:
        text = (
            f"{named} is at its rate limit ({limit.rate}): {usage.started:,} started "
            f"in the last {window_words(limit.rate.per)}"
        )
        reasons.append(Reason("key_rate", text, limit_key=key))
    return reasons


def _group(store: JobStore, job: Job, now: datetime) -> list[Reason]:
    if job.group is None or not isinstance(store, OperatorStore):
        return []
    selection = JobSelection(state=str(JobState.RUNNING), group=job.group)
    running = [j.id for j in store.job_select(selection, now, Page(1)) if j.id != job.id]
    if not running:
        return []
    text = f"job {running[0]} of its group {job.group!r} is running (one at a time per group)"
    return [Reason("group_busy", text, job_ids=(running[0],))]


def _workers(store: JobStore, job: Job, now: datetime, silent_after: timedelta) -> list[Reason]:
    if not isinstance(store, OperatorStore):
        return []
    live = [w for w in store.worker_list() if now - w.last_seen_at <= silent_after]
    if any(job.queue in w.queues for w in live):
        return []
    if live:
        text = f"no live worker serves queue {job.queue!r} ({len(live)} live on other queues)"
    else:
        text = "no live worker: start one (conveyor worker)"
    return [Reason("no_worker", text)]
