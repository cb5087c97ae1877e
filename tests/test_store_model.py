"""A real store, driven by random sequences of operations, checked against a model.

The model is a small piece of plain Python that restates the state machine
of docs/architecture.md: which jobs a claim hands out (priority first, then
oldest; only ready jobs: due, in a queue that is not paused, and the oldest queued job of a group
with no running job), what every lease-checked write does with a held or a
stale lease, and what rescue, cancel, manual retry and purge do. After every
step the store must hold exactly the model's jobs in the model's states, with
the model's history of events.

The clock is a fixed value that the rules advance; nothing here reads real time.
Leases last a whole number of seconds plus a half, and the clock moves in whole
seconds, so a lease never expires exactly "now" (whether that instant counts as
expired is not part of the contract), while ``run_at == now`` (ready: the
contract says ``run_at <= now``) happens often.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from conveyor.errors import JobStateError
from conveyor.expiry import EXPIRED_ERROR
from conveyor.job import HOLD_AT, Job, JobState, NewJob
from conveyor.retain import read_retain, resolve_retain
from conveyor.store.dsn import open_store
from conveyor.store.expiring import ExpiringStore
from conveyor.store.protocols import HoldStore, Store
from conveyor.store.records import Finish, Lease, Purge
from conveyor.store.retaining import RetainingStore
from durable_model import DurableRules
from outcomes import Failure, cancel_one, cancelled, listed, purge, released, retry_one

START = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=20.5)
QUEUES = ("q1", "q2")
KEYS = ("k1", "k2", "k3")
GROUPS = ("g1", "g2")
#: Seconds from now to run_at: mostly ready at once.
DELAYS = (0, 0, 0, 5, 60)
ERROR_LEASE_LOST = "worker lost: lease expired"

QUEUED, RUNNING = JobState.QUEUED, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)

#: queue, key, unique, group, priority, delay in seconds, max_attempts
JobSpec = tuple[str, str | None, str, str | None, int, int, int]
JOB_SPECS = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from([None, None, *KEYS]),
    st.sampled_from(["live", "live", "forever"]),
    st.sampled_from([None, None, *GROUPS]),
    st.integers(0, 2),
    st.sampled_from(DELAYS),
    st.integers(1, 3),
)

#: retain= options: one age for every final state, or some states only (whole seconds,
#: so that a rule runs out exactly "now" as often as the clock allows).
RETAINS = st.sampled_from(
    [0, 10, {"succeeded": 0}, {"failed": 30, "cancelled": 1}, {"succeeded": 60}]
)

#: Most batches carry no rule, so that the queue's age rules meet both kinds of job.
MAYBE_RETAIN = st.one_of(st.none(), st.none(), RETAINS)

SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class ModelJob:
    id: int
    queue: str
    priority: int
    run_at: datetime
    max_attempts: int
    key: str | None
    group: str | None
    state: JobState = QUEUED
    attempts: int = 0
    token: str | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    finished_at: datetime | None = None
    #: The error of the last failed attempt (kept while queued again), cleared by a manual retry.
    error: str | None = None
    #: (kind, attempt) of each event, oldest first.
    events: list[tuple[str, int]] = field(default_factory=list)
    #: While held (run_at parked at HOLD_AT): the run_at it had.
    held_run_at: datetime | None = None
    #: When it was enqueued (a unique window counts from it).
    created_at: datetime = START
    #: Its deadline to start by (expires=), cleared by a manual retry.
    expires_at: datetime | None = None
    #: Its own retention (retain=): seconds kept once finished, by final state.
    retain: dict[str, float] | None = None

    @property
    def live(self) -> bool:
        return self.state in (QUEUED, RUNNING)

    def finish(self, state: JobState, now: datetime) -> None:
        self.state = state
        self.token = None
        self.lease_expires_at = None
        if state in TERMINAL:
            self.finished_at = now


@dataclass
class Model:
    now: datetime = START
    jobs: dict[int, ModelJob] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    #: The highest id handed out so far: ids only grow, and a purged job's id is never reused.
    last_id: int = 0

    def running(self) -> list[ModelJob]:
        return [j for j in self.jobs.values() if j.state == RUNNING]

    def ready(self, job: ModelJob) -> bool:
        if job.state != QUEUED or job.run_at > self.now or job.queue in self.paused:
            return False
        if job.expires_at is not None and job.expires_at <= self.now:
            return False  # past its deadline: never claimed
        if job.group is None:
            return True
        same_group = [j for j in self.jobs.values() if j.group == job.group]
        return not any(j.state == RUNNING for j in same_group) and not any(
            j.state == QUEUED and j.id < job.id for j in same_group
        )

    def claimable(self, queues: list[str], limit: int, group: str | None) -> list[ModelJob]:
        ready = [
            j
            for j in self.jobs.values()
            if j.queue in queues and (group is None or j.group == group) and self.ready(j)
        ]
        return sorted(ready, key=lambda j: (-j.priority, j.id))[:limit]

    def holder(self, lease: Lease) -> ModelJob | None:
        """The job a lease still holds, if it does."""
        job = self.jobs.get(lease.id)
        if job is None or job.state != RUNNING or job.token != lease.token:
            return None
        return job

    def key_holders(self, queue: str, key: str) -> list[ModelJob]:
        """Jobs (not purged) holding the key in the queue, newest first."""
        found = [j for j in self.jobs.values() if j.queue == queue and j.key == key]
        return sorted(found, key=lambda j: -j.id)


class StoreMachine(DurableRules, RuleBasedStateMachine):
    """Subclassed by each test with ``open_fresh_store``: a store on an empty database."""

    open_fresh_store: Callable[[], tuple[Store, Callable[[], None]]]

    def __init__(self) -> None:
        super().__init__()
        self.store, self._cleanup = type(self).open_fresh_store()
        self.model = Model()
        #: Every lease ever handed out, in order: the held ones and the stale ones.
        self.leases: list[Lease] = []

    def teardown(self) -> None:
        self._cleanup()

    # --- helpers ---------------------------------------------------------------

    def _pick_lease(self, data: st.DataObject) -> Lease:
        """Mostly a lease still held; else a stale one, preferably of a job running again."""
        held = [le for le in self.leases if self.model.holder(le) is not None]
        stale = [le for le in self.leases if self.model.holder(le) is None]
        if held and (not stale or data.draw(st.integers(0, 3), label="stale?") > 0):
            return data.draw(st.sampled_from(held), label="held lease")
        # The sharpest test of fencing: the job is running under a newer lease.
        superseded = [le for le in stale if self._state(le.id) == RUNNING]
        if superseded and data.draw(st.booleans(), label="superseded?"):
            return data.draw(st.sampled_from(superseded), label="superseded lease")
        return data.draw(st.sampled_from(stale), label="stale lease")

    def _state(self, job_id: int) -> JobState | None:
        job = self.model.jobs.get(job_id)
        return None if job is None else job.state

    def _pick_job_id(self, data: st.DataObject, *likely: JobState) -> int:
        """Any job, mostly one in a state in ``likely``, sometimes one that does not exist."""
        ids = sorted(self.model.jobs)
        if not ids or data.draw(st.integers(0, 9), label="unknown id?") == 0:
            return max([0, *ids, *(le.id for le in self.leases)]) + 1000
        preferred = [i for i in ids if self.model.jobs[i].state in likely]
        if preferred and data.draw(st.integers(0, 3), label="likely state?") > 0:
            return data.draw(st.sampled_from(preferred), label="job id")
        return data.draw(st.sampled_from(ids), label="job id")

    # --- producing -------------------------------------------------------------

    @initialize(specs=st.lists(JOB_SPECS, min_size=3, max_size=8), retain=MAYBE_RETAIN)
    def start(self, specs: list[JobSpec], retain: object) -> None:
        assert listed(self.store, limit=10) == []
        self._enqueue(specs, retain)

    @rule(specs=st.lists(JOB_SPECS, min_size=1, max_size=3), retain=MAYBE_RETAIN)
    def enqueue(self, specs: list[JobSpec], retain: object) -> None:
        self._enqueue(specs, retain)

    @precondition(lambda self: any(j.key is not None for j in self.model.jobs.values()))
    @rule(data=st.data(), unique=st.sampled_from(["live", "forever"]))
    def enqueue_same_key(self, data: st.DataObject, unique: str) -> None:
        """A producer enqueues a key it used before (the job may be live or finished)."""
        keyed = [j for j in self.model.jobs.values() if j.key is not None]
        old = data.draw(st.sampled_from(sorted(keyed, key=lambda j: j.id)), label="same key as")
        self._enqueue([(old.queue, old.key, unique, old.group, old.priority, 0, old.max_attempts)])

    def _enqueue(self, specs: list[JobSpec], retain: object = None) -> None:
        """Enqueue in one batch, each job with the same ``retain=`` (None: none)."""
        now = self.model.now
        rule = resolve_retain(retain)
        new_jobs = [
            NewJob(
                queue=queue,
                task="t",
                args_json="[]",
                kwargs_json="{}",
                run_at=now + timedelta(seconds=delay),
                priority=priority,
                max_attempts=max_attempts,
                key=key,
                unique=unique,
                group=group,
                retain=rule,
            )
            for queue, key, unique, group, priority, delay, max_attempts in specs
        ]
        got = self.store.job_insert_many(new_jobs, now)
        assert len(got) == len(new_jobs)

        # The model's answer, position by position: an existing job or a new one.
        first_of_key: dict[tuple[str, str], int] = {}
        for position, (new, job) in enumerate(zip(new_jobs, got, strict=True)):
            if new.key is not None:
                pair = (new.queue, new.key)
                if pair in first_of_key:
                    assert job.id == got[first_of_key[pair]].id, f"position {position}"
                    continue
                first_of_key[pair] = position
                holders = self.model.key_holders(new.queue, new.key)
                live = [j for j in holders if j.live]
                existing = None
                if live:
                    existing = live[0]
                elif holders and new.unique == "forever":
                    existing = holders[0]
                if existing is not None:
                    assert job.id == existing.id, f"position {position}: expected the existing job"
                    continue
            assert job.id > self.model.last_id, f"position {position}: new job got id {job.id}"
            self.model.last_id = job.id
            assert job.state == QUEUED
            self.model.jobs[job.id] = _model_job(job.id, new, now)

    # --- working ---------------------------------------------------------------

    CLAIM_ARGS: ClassVar[dict[str, st.SearchStrategy[Any]]] = {
        "queues": st.sampled_from([["q1", "q2"], ["q2", "q1"], ["q1"], ["q2"]]),
        "limit": st.integers(1, 3),
        "group": st.sampled_from([None, None, None, None, *GROUPS]),
    }

    @rule(**CLAIM_ARGS)
    def claim(self, queues: list[str], limit: int, group: str | None) -> None:
        self._claim(queues, limit, group)

    @rule(**CLAIM_ARGS)
    def claim_again(self, queues: list[str], limit: int, group: str | None) -> None:
        """The same rule twice, so that claims come as often as the steps that end them."""
        self._claim(queues, limit, group)

    def _claim(self, queues: list[str], limit: int, group: str | None) -> None:
        expected = self.model.claimable(queues, limit, group)
        got = self.store.job_claim(queues, limit, "w", LEASE, self.model.now, group=group)
        assert [j.id for j in got] == [j.id for j in expected]
        tokens = {j.lease_token for j in got}
        assert None not in tokens
        assert not tokens & {le.token for le in self.leases}, "a lease token was reused"
        for job, mine in zip(got, expected, strict=True):
            mine.state = RUNNING
            mine.attempts += 1
            mine.token = job.lease_token
            mine.lease_expires_at = self.model.now + LEASE
            mine.events.append(("claimed", mine.attempts))
            assert job.state == RUNNING
            assert job.attempts == mine.attempts
            self.leases.append(Lease(job.id, job.lease_token or ""))
        self._claim_may_end_expired(queues)

    END_ARGS: ClassVar[dict[str, st.SearchStrategy[Any]]] = {
        "data": st.data(),
        "action": st.sampled_from(["complete", "fail", "fail", "snooze", "release", "cancelled"]),
        "retryable": st.booleans(),
        "delay": st.sampled_from(DELAYS),
    }

    @precondition(lambda self: self.leases)
    @rule(**END_ARGS)
    def end_lease(self, data: st.DataObject, action: str, retryable: bool, delay: int) -> None:
        """A worker reports how its job ended, under a lease it holds (or one it lost)."""
        self._end_lease(self._pick_lease(data), action, retryable, delay)

    @precondition(lambda self: self.leases)
    @rule(**END_ARGS)
    def end_lease_again(
        self, data: st.DataObject, action: str, retryable: bool, delay: int
    ) -> None:
        self._end_lease(self._pick_lease(data), action, retryable, delay)

    def _end_lease(self, lease: Lease, action: str, retryable: bool, delay: int) -> None:
        if action == "complete":
            self._complete(lease)
        elif action == "fail":
            self._fail(lease, retryable, delay)
        elif action == "snooze":
            self._snooze(lease, delay)
        elif action == "release":
            self._release(lease)
        else:
            self._set_cancelled(lease)

    def _complete(self, lease: Lease) -> None:
        job = self.model.holder(lease)
        got = self.store.job_finish([Finish.complete(lease.id, lease.token, "1")], self.model.now)
        assert got == ([lease.id] if job else [])
        if job:
            job.finish(SUCCEEDED, self.model.now)
            job.events.append(("succeeded", job.attempts))

    def _fail(self, lease: Lease, retryable: bool, delay: int) -> None:
        job = self.model.holder(lease)
        now = self.model.now
        retry_at = now + timedelta(seconds=delay)
        failure = Failure(lease.id, lease.token, "boom", retry_at, retryable=retryable)
        got = self.store.job_finish([failure], now)
        assert got == ([lease.id] if job else [])
        if not job:
            return
        if job.cancel_requested:
            job.finish(CANCELLED, now)
            job.events.append(("cancelled", job.attempts))
        elif retryable and job.attempts < job.max_attempts:
            job.error = "boom"
            job.finish(QUEUED, now)
            job.run_at = retry_at
            job.events.append(("retried", job.attempts))
        else:
            job.error = "boom"
            job.finish(FAILED, now)
            job.events.append(("failed", job.attempts))

    def _snooze(self, lease: Lease, delay: int) -> None:
        job = self.model.holder(lease)
        now = self.model.now
        run_at = now + timedelta(seconds=delay)
        got = self.store.job_finish([Finish.snooze(lease.id, lease.token, run_at)], now)
        assert got == ([lease.id] if job else [])
        if not job:
            return
        ran = job.attempts
        job.attempts -= 1  # a snooze is not a failure: the attempt is given back
        if job.cancel_requested:
            job.finish(CANCELLED, now)
            job.events.append(("cancelled", ran))
        else:
            job.finish(QUEUED, now)
            job.run_at = run_at
            job.events.append(("snoozed", ran))

    def _release(self, lease: Lease) -> None:
        job = self.model.holder(lease)
        now = self.model.now
        got = self.store.job_finish(released([lease]), now)
        assert got == ([lease.id] if job else [])
        if not job:
            return
        ran = job.attempts
        job.attempts -= 1
        if job.cancel_requested:
            job.finish(CANCELLED, now)
            job.events.append(("cancelled", ran))
        else:
            job.finish(QUEUED, now)
            job.events.append(("released", ran))

    def _set_cancelled(self, lease: Lease) -> None:
        job = self.model.holder(lease)
        got = self.store.job_finish(cancelled([lease]), self.model.now)
        assert got == ([lease.id] if job else [])
        if job:
            job.finish(CANCELLED, self.model.now)
            job.events.append(("cancelled", job.attempts))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, 3), label="how many leases")
        leases = list(dict.fromkeys(self._pick_lease(data) for _ in range(count)))
        now = self.model.now
        expected = {}
        for lease in leases:
            job = self.model.holder(lease)
            if job:
                job.lease_expires_at = now + LEASE
                expected[job.id] = job.cancel_requested
        got = self.store.job_heartbeat(leases, LEASE, now)
        assert {s.id: s.cancel_requested for s in got} == expected
        assert len(got) == len(expected)

    @rule()
    def rescue_expired(self) -> None:
        self._rescue_expired()

    @rule(seconds=st.sampled_from([10, 30]))
    def time_passes_then_rescue(self, seconds: int) -> None:
        """What the maintenance loop does while workers are gone: time passes, leases expire."""
        self.model.now += timedelta(seconds=seconds)
        self._rescue_expired()

    def _rescue_expired(self) -> None:
        now = self.model.now
        expired = [
            j for j in self.model.running() if j.lease_expires_at and j.lease_expires_at < now
        ]
        got = self.store.job_rescue_expired(now)
        assert sorted(got) == sorted(j.id for j in expired)
        for job in expired:
            job.events.append(("rescued", job.attempts))
            job.error = ERROR_LEASE_LOST
            if job.cancel_requested:
                job.finish(CANCELLED, now)
                job.events.append(("cancelled", job.attempts))
            elif job.attempts < job.max_attempts:
                job.finish(QUEUED, now)
                job.run_at = now
            else:
                job.finish(FAILED, now)
                job.events.append(("failed", job.attempts))

    # --- enqueue options: expiry, unique windows, replace ----------------------------

    @rule(spec=JOB_SPECS, expires_in=st.sampled_from([1, 10, 45]))
    def enqueue_expiring(self, spec: JobSpec, expires_in: int) -> None:
        """A job with a deadline to start by (never in a group: a head that expired
        would hold its group back, a case the expiry tests cover)."""
        queue, key, unique, _, priority, delay, max_attempts = spec
        now = self.model.now
        run_at = now + timedelta(seconds=delay)
        expires_at = run_at + timedelta(seconds=expires_in)
        new = NewJob(
            queue, "t", "[]", "{}", run_at=run_at, priority=priority, max_attempts=max_attempts,
            key=key, unique=unique, expires_at=expires_at,  # type: ignore[arg-type]
        )  # fmt: skip
        self._enqueue_one(new)

    @precondition(lambda self: any(j.key is not None for j in self.model.jobs.values()))
    @rule(
        data=st.data(),
        period=st.sampled_from([None, 15.5, 45.5]),
        states=st.sampled_from([("succeeded",), ("succeeded", "failed"), ("cancelled",), ()]),
    )
    def enqueue_in_a_window(
        self, data: st.DataObject, period: float | None, states: tuple[str, ...]
    ) -> None:
        """A key unique for a period after its job was enqueued, among chosen states
        (the periods end half-way between two ticks of the clock: never on a job)."""
        old = self._keyed_job(data)
        now = self.model.now
        since = None if period is None else now - timedelta(seconds=period)
        new = NewJob(
            old.queue, "t", "[]", "{}", run_at=now, key=old.key, unique="live",
            unique_states=states, unique_since=since,
        )  # fmt: skip
        self._enqueue_one(new)

    @precondition(lambda self: any(j.key is not None for j in self.model.jobs.values()))
    @rule(data=st.data(), period=st.sampled_from([None, 15.5]), state=st.sampled_from(TERMINAL))
    def enqueue_in_a_window_again(
        self, data: st.DataObject, period: float | None, state: str
    ) -> None:
        """The same rule twice, so that windows meet finished jobs often."""
        self.enqueue_in_a_window(data, period, (str(state),))

    @precondition(lambda self: any(j.key is not None for j in self.model.jobs.values()))
    @rule(data=st.data(), priority=st.integers(0, 2), delay=st.sampled_from(DELAYS))
    def enqueue_replacing(self, data: st.DataObject, priority: int, delay: int) -> None:
        """on_conflict="replace": the queued job of the key takes the new run_at and
        priority (a held one keeps its hold); a running one gives its key up."""
        old = self._keyed_job(data)
        run_at = self.model.now + timedelta(seconds=delay)
        new = NewJob(
            old.queue, "t", "[]", "{}", run_at=run_at, priority=priority, key=old.key,
            on_conflict="replace",
        )  # fmt: skip
        self._enqueue_one(new)

    @rule()
    def expire(self) -> None:
        """The maintenance sweep: queued jobs past their deadline end cancelled."""
        now = self.model.now
        due = sorted(
            j.id
            for j in self.model.jobs.values()
            if j.state == QUEUED and j.expires_at is not None and j.expires_at <= now
        )
        assert isinstance(self.store, ExpiringStore)
        assert self.store.job_expire(now) == due
        for job_id in due:
            self._expired(self.model.jobs[job_id])

    def _keyed_job(self, data: st.DataObject) -> ModelJob:
        """A job with a key, mostly one whose key no live job holds (so that a window
        is judged on finished jobs alone)."""
        keyed = sorted(
            (j for j in self.model.jobs.values() if j.key is not None), key=lambda j: j.id
        )
        free = [
            j
            for j in keyed
            if not any(h.live for h in self.model.key_holders(j.queue, j.key or ""))
        ]
        if free and data.draw(st.integers(0, 3), label="free key?") > 0:
            return data.draw(st.sampled_from(free), label="same free key as")
        return data.draw(st.sampled_from(keyed), label="same key as")

    def _expired(self, job: ModelJob) -> None:
        job.finish(CANCELLED, self.model.now)
        job.error = EXPIRED_ERROR
        job.events.append(("cancelled", job.attempts))

    def _claim_may_end_expired(self, queues: list[str]) -> None:
        """A claim may end the queued jobs past their deadline that it meets (Redis's
        does, the SQL stores' pass them by): which ones depends on its walk, so the
        model takes each from the store, and checks that it ended as an expiry."""
        now = self.model.now
        for job in list(self.model.jobs.values()):
            if job.queue not in queues or job.state != QUEUED or job.expires_at is None:
                continue
            if job.expires_at <= now and job.queue not in self.model.paused:
                stored = self.store.job_get(job.id)
                assert stored is not None and stored.state in (QUEUED, CANCELLED)
                if stored.state == CANCELLED:
                    assert stored.error == EXPIRED_ERROR and stored.finished_at == now
                    self._expired(job)

    def _enqueue_one(self, new: NewJob) -> None:
        now = self.model.now
        (got,) = self.store.job_insert_many([new], now)
        holders = self.model.key_holders(new.queue, new.key) if new.key is not None else []
        live = [j for j in holders if j.live]
        if new.on_conflict == "replace" and live:
            holder = live[0]
            if holder.state == QUEUED:
                holder.priority = new.priority
                if holder.run_at >= HOLD_AT:
                    holder.held_run_at = new.run_at
                else:
                    holder.run_at = new.run_at
                holder.events.append(("replaced", holder.attempts))
                assert got.id == holder.id, "the queued job of the key is replaced"
                return
            holder.key = None  # running: never changed, but its key goes to a new job
            holders, live = [j for j in holders if j is not holder], []
        existing = live[0] if live else None
        if existing is None and new.unique_states is not None:
            since = new.unique_since
            fits = [
                j
                for j in holders
                if str(j.state) in new.unique_states and (since is None or j.created_at >= since)
            ]
            existing = fits[0] if fits else None
        elif existing is None and new.unique == "forever" and holders:
            existing = holders[0]
        if existing is not None:
            assert got.id == existing.id, "expected the job holding the key"
            return
        assert got.id > self.model.last_id and got.state == QUEUED
        self.model.last_id = got.id
        self.model.jobs[got.id] = _model_job(got.id, new, now)

    # --- retention per job (retain=) ----------------------------------------------

    @rule(
        specs=st.lists(JOB_SPECS, min_size=1, max_size=3),
        retain=RETAINS,
        cancel=st.booleans(),
    )
    def enqueue_retained(self, specs: list[JobSpec], retain: object, cancel: bool) -> None:
        """Jobs with their own retention; a key that answers an existing job keeps that
        job's rule (or none). With ``cancel``, an operator cancels the last one at once:
        finished jobs with a rule come often, not only after a claim and its end."""
        for queue, key, unique, group, priority, delay, max_attempts in specs:
            new = NewJob(
                queue, "t", "[]", "{}", run_at=self.model.now + timedelta(seconds=delay),
                priority=priority, max_attempts=max_attempts, key=key, unique=unique,
                group=group, retain=resolve_retain(retain),  # type: ignore[arg-type]
            )  # fmt: skip
            self._enqueue_one(new)
        if cancel:
            self._cancel(self.model.last_id)

    @rule()
    def purge_retained(self) -> None:
        self._purge_retained()

    @rule()
    def purge_retained_again(self) -> None:
        """The same rule twice, so that a rule of 0 is often judged in the tick the job
        finished in (``<=``: it goes)."""
        self._purge_retained()

    def _purge_retained(self) -> None:
        """The retention round: a finished job goes once its own rule for the state it
        ended in has run out (``finished_at + rule <= now``); other states stay."""
        now = self.model.now
        doomed = [j.id for j in self.model.jobs.values() if _retained_until(j, now)]
        assert isinstance(self.store, RetainingStore)
        assert self.store.job_purge_retained(now) == len(doomed)
        for job_id in doomed:
            del self.model.jobs[job_id]
        self.forget_waits(doomed)

    @rule(
        ago=st.sampled_from([0.5, 10.5]),
        states=st.sampled_from([TERMINAL, (SUCCEEDED,), (FAILED, CANCELLED)]),
        queue=st.sampled_from([None, *QUEUES]),
    )
    def purge_by_policy(self, ago: float, states: tuple[JobState, ...], queue: str | None) -> None:
        self._purge_by_policy(ago, states, queue)

    @rule(states=st.sampled_from([TERMINAL, (SUCCEEDED,)]))
    def purge_by_policy_again(self, states: tuple[JobState, ...]) -> None:
        """The same rule twice, so that it meets finished jobs with a rule often: an age
        that takes every job finished by now (the clock moves in whole seconds)."""
        self._purge_by_policy(-0.5, states, None)

    def _purge_by_policy(self, ago: float, states: tuple[JobState, ...], queue: str | None) -> None:
        """A queue's age rule: it passes over a job whose own rule names its final state."""
        before = self.model.now - timedelta(seconds=ago)
        doomed = [
            j.id
            for j in self.model.jobs.values()
            if j.state in states
            and (queue is None or j.queue == queue)
            and j.finished_at is not None
            and j.finished_at < before
            and not (j.retain and str(j.state) in j.retain)
        ]
        names = tuple(str(s) for s in states)
        got = self.store.job_purge_where(Purge(before, names, queue=queue, by_policy=True))
        assert got == len(doomed)
        for job_id in doomed:
            del self.model.jobs[job_id]
        self.forget_waits(doomed)

    # --- operating ---------------------------------------------------------------

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        self._cancel(self._pick_job_id(data, RUNNING))

    def _cancel(self, job_id: int) -> None:
        now = self.model.now
        got = cancel_one(self.store, job_id, now)
        job = self.model.jobs.get(job_id)
        if job is None:
            assert got is None
            return
        self.cancel_children(job_id, job.state == QUEUED)  # parked waiting for them (ctx.wait)
        if job.state == QUEUED:
            job.finish(CANCELLED, now)
            job.events.append(("cancelled", job.attempts))
        elif job.state == RUNNING and not job.cancel_requested:
            job.cancel_requested = True
            job.events.append(("cancel_requested", job.attempts))
        assert got is not None
        assert got.id == job_id
        assert got.state == job.state

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        job_id = self._pick_job_id(data, FAILED, CANCELLED)
        now = self.model.now
        job = self.model.jobs.get(job_id)
        if job is None:
            assert retry_one(self.store, job_id, now) is None
            return
        # A keyed job comes back only as the newest job of its key, and only when no
        # live job holds the key (the stores' retry_key_rule).
        key_taken = job.key is not None and any(
            j.id != job.id and (j.live or j.id > job.id)
            for j in self.model.key_holders(job.queue, job.key)
        )
        if job.state not in (FAILED, CANCELLED) or key_taken:
            with pytest.raises(JobStateError):
                retry_one(self.store, job_id, now)
            return
        got = retry_one(self.store, job_id, now)
        job.state = QUEUED
        job.attempts = 0
        job.run_at = now
        job.cancel_requested = False
        job.finished_at = None
        job.error = None
        job.expires_at = None  # running it again is the operator's choice
        job.events.append(("manual_retry", 0))
        assert got is not None
        assert got.id == job_id
        assert got.state == QUEUED

    @rule(ago=st.sampled_from([0.5, 10.5]))
    def purge(self, ago: float) -> None:
        before = self.model.now - timedelta(seconds=ago)
        doomed = [
            j.id
            for j in self.model.jobs.values()
            if j.state in TERMINAL and j.finished_at is not None and j.finished_at < before
        ]
        assert purge(self.store, before) == len(doomed)
        for job_id in doomed:
            del self.model.jobs[job_id]
        self.forget_waits(doomed)

    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        """An operator holds a job: only a queued one that is not held yet changes."""
        job_id = self._pick_job_id(data, QUEUED)
        got = cast(HoldStore, self.store).job_hold([job_id], self.model.now)
        job = self.model.jobs.get(job_id)
        if job is None or job.state != QUEUED or job.run_at >= HOLD_AT:
            assert got == []
            return
        assert got == [job_id]
        job.held_run_at, job.run_at = job.run_at, HOLD_AT
        job.events.append(("held", job.attempts))

    @rule(data=st.data())
    def unhold(self, data: st.DataObject) -> None:
        """An operator lets a held job go: due at the run_at it had."""
        job_id = self._pick_job_id(data, QUEUED)
        got = cast(HoldStore, self.store).job_unhold([job_id], self.model.now)
        job = self.model.jobs.get(job_id)
        if job is None or job.state != QUEUED or job.run_at < HOLD_AT:
            assert got == []
            return
        assert got == [job_id]
        job.run_at, job.held_run_at = job.held_run_at or self.model.now, None
        job.events.append(("unheld", job.attempts))

    @rule(queue=st.sampled_from(QUEUES), paused=st.sampled_from([False, False, True]))
    def pause_or_resume(self, queue: str, paused: bool) -> None:
        if paused:
            self.store.queue_pause(queue, self.model.now)
            self.model.paused.add(queue)
        else:
            self.store.queue_resume(queue, self.model.now)
            self.model.paused.discard(queue)

    @rule(seconds=st.sampled_from([1, 5, 20, 30, 60]))
    def advance_clock(self, seconds: int) -> None:
        self.model.now += timedelta(seconds=seconds)

    # --- invariants -----------------------------------------------------------

    @invariant()
    def store_matches_model(self) -> None:
        jobs = listed(self.store, limit=10_000)
        model = self.model.jobs
        assert sorted(j.id for j in jobs) == sorted(model)
        for job in jobs:
            mine = model[job.id]
            seen = _observed(job)
            wanted = _expected(mine)
            assert seen == wanted, f"job {job.id}: store {seen} != model {wanted}"

        running = [j for j in jobs if j.state == RUNNING]
        groups = [j.group for j in running if j.group is not None]
        assert len(groups) == len(set(groups)), "two running jobs share a group"
        live_keys = [(j.queue, j.key) for j in jobs if j.key is not None and not j.terminal]
        assert len(live_keys) == len(set(live_keys)), "two live jobs share a key"
        assert all(j.attempts <= j.max_attempts for j in running)

        assert self.store.queue_paused() & set(QUEUES) == self.model.paused
        now = self.model.now
        waiting = [
            (j.run_at - now).total_seconds()
            for j in model.values()
            if j.state == QUEUED and j.run_at > now and j.queue not in self.model.paused
        ]
        assert self.store.next_run_in(QUEUES, now) == (min(waiting) if waiting else None)

    @invariant()
    def history_matches_model(self) -> None:
        # The stored log, in seq order, one row per event (a claim writes none)...
        events = self.store.event_since(0, 100_000)
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        # Every event names a job of the model (PostgreSQL names an enqueue's event,
        # which counts its jobs, after the first of them; the others' enqueue is on
        # their rows, shown by event_list).
        assert {e.job_id for e in events} <= set(self.model.jobs)
        # ...and each job's history, every attempt shown with its claim.
        seen = {
            job_id: [(e.kind, e.attempt) for e in self.store.event_list(job_id)]
            for job_id in self.model.jobs
        }
        wanted = {j.id: j.events for j in self.model.jobs.values()}
        assert seen == wanted


def _model_job(job_id: int, new: NewJob, now: datetime) -> ModelJob:
    """The model's record of a job the store has just inserted from ``new``."""
    return ModelJob(
        id=job_id,
        queue=new.queue,
        priority=new.priority,
        run_at=new.run_at,
        max_attempts=new.max_attempts,
        key=new.key,
        group=new.group,
        events=[("enqueued", 0)],
        created_at=now,
        expires_at=new.expires_at,
        retain=_seconds_by_state(new.retain),
    )


def _seconds_by_state(stored: str | None) -> dict[str, float] | None:
    rule = read_retain(stored)
    return None if rule is None else {s: age.total_seconds() for s, age in rule.items()}


def _retained_until(job: ModelJob, now: datetime) -> bool:
    """Whether the job's own rule for its final state has run out at ``now``."""
    if job.retain is None or job.finished_at is None or str(job.state) not in job.retain:
        return False
    return job.finished_at + timedelta(seconds=job.retain[str(job.state)]) <= now


def _observed(job: Job) -> dict[str, object]:
    lease = (job.lease_token, job.lease_expires_at, job.cancel_requested)
    return _comparable(job.state, job, lease)


def _expected(job: ModelJob) -> dict[str, object]:
    return _comparable(job.state, job, (job.token, job.lease_expires_at, job.cancel_requested))


def _comparable(
    state: JobState, job: Job | ModelJob, lease: tuple[object, ...]
) -> dict[str, object]:
    """The fields the model predicts; some only mean something in some states."""
    fields: dict[str, object] = {
        "state": str(state),
        "queue": job.queue,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "key": job.key,
        "group": job.group,
    }
    if state == QUEUED:
        fields["run_at"] = job.run_at
    if state == RUNNING:
        fields["lease"] = lease
    if state in TERMINAL:
        fields["finished_at"] = job.finished_at
    if state in (QUEUED, FAILED):
        fields["error"] = job.error
    return fields


def _machine(open_fresh_store: Callable[[], tuple[Store, Callable[[], None]]]) -> type:
    return type("Machine", (StoreMachine,), {"open_fresh_store": staticmethod(open_fresh_store)})


def test_sqlite_store_follows_the_model(tmp_path: Path) -> None:
    counter = itertools.count()

    def open_fresh_store() -> tuple[Store, Callable[[], None]]:
        path = tmp_path / f"model-{next(counter)}.db"
        store = open_store(f"sqlite:///{path}")
        store.migrate()

        def cleanup() -> None:
            store.close()
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        return store, cleanup

    run_state_machine_as_test(_machine(open_fresh_store), settings=SETTINGS)


@pytest.fixture
def pg_model_dsn(pg_clean_dsn: str) -> Iterator[str]:
    """One migrated database for the whole test; each example empties it first."""
    store = open_store(pg_clean_dsn)
    try:
        store.migrate()
    finally:
        store.close()
    yield pg_clean_dsn


def _empty_postgres(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename <> 'schema_migrations' ORDER BY tablename"
            )
        ]
        conn.execute(
            sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(map(sql.Identifier, tables))
            )
        )


def test_postgres_store_follows_the_model(pg_model_dsn: str) -> None:
    def open_fresh_store() -> tuple[Store, Callable[[], None]]:
        _empty_postgres(pg_model_dsn)
        store = open_store(pg_model_dsn, min_size=1, max_size=2)
        return store, store.close

    run_state_machine_as_test(_machine(open_fresh_store), settings=SETTINGS)


def test_redis_store_follows_the_model(redis_clean_dsn: str) -> None:
    def open_fresh_store() -> tuple[Store, Callable[[], None]]:
        import redis

        client = redis.Redis.from_url(redis_clean_dsn)
        try:
            client.flushall()
        finally:
            client.close()
        store = open_store(redis_clean_dsn)
        store.migrate()
        return store, store.close

    run_state_machine_as_test(_machine(open_fresh_store), settings=SETTINGS)
