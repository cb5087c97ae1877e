"""The model test's rules for parked waits (tests/test_store_model.py): a running job
sleeps, waits for a signal or for children (parked: queued for the wait's end, or on
at once when its signal came, its time is over or its children ended), a signal
sent wakes a job parked waiting for it, an operator wakes a parked job early, and
cancelling a parked parent cancels the children it waits for, and theirs.

A mixin of the model's state machine: its rules drive the store's SignalStore and
restate each rule in the model; its invariant compares every job's wait, and the
parked counts, with the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from conveyor.job import JobState
from conveyor.store.records import Finish, Lease
from conveyor.store.signals import SignalStore
from outcomes import cancel_one

QUEUED, RUNNING = JobState.QUEUED, JobState.RUNNING
LIVE = (JobState.WAITING, QUEUED, RUNNING)
#: Seconds from now to a wait's end: over already (0), soon, or later.
WAIT_ENDS = (0, 5, 60)


@dataclass
class ModelWait:
    step: str
    signal: str | None
    children: list[int] | None
    until: datetime


@dataclass
class DurableModel:
    #: Each job's wait, as the store marks it (kept after the job moves on, until
    #: a wait of the job ends it or the job is deleted).
    waits: dict[int, ModelWait] = field(default_factory=dict)
    #: Signals "go" sent to each job and not taken yet.
    pending: dict[int, int] = field(default_factory=dict)
    #: Each job's waits for "go" that ended (taken or timed out): recorded as steps,
    #: so its next wait is the next step, as ctx.wait_for numbers them (a replay of
    #: a recorded one returns the step and never asks the store).
    ended: dict[int, int] = field(default_factory=dict)


class DurableRules:
    """Rules and an invariant for the parked waits; mixed into the model's machine."""

    store: Any
    model: Any
    leases: list[Lease]

    def __init__(self) -> None:
        super().__init__()
        self.durable = DurableModel()

    def _pick_lease(self, data: st.DataObject) -> Lease:  # the machine's own
        raise NotImplementedError

    def _pick_job_id(self, data: st.DataObject, *likely: JobState) -> int:  # the machine's own
        raise NotImplementedError

    @property
    def _signals(self) -> SignalStore:
        return cast(SignalStore, self.store)

    def _park(self, lease: Lease, until: datetime) -> None:
        """The job of a held lease queued again for its wait's end (a snooze), in the model."""
        job = self.model.holder(lease)
        ran = job.attempts
        job.attempts -= 1  # no attempt used
        if job.cancel_requested:
            job.finish(JobState.CANCELLED, self.model.now)
            job.events.append(("cancelled", ran))
        else:
            job.finish(QUEUED, self.model.now)
            job.run_at = until
            job.held_run_at = None
            job.events.append(("snoozed", ran))

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), ends=st.sampled_from(WAIT_ENDS))
    def sleep(self, data: st.DataObject, ends: int) -> None:
        """ctx.sleep: the wait marked (an earlier mark of the step keeps its time), then
        the worker's snooze to its time; or, its time over, the wait ended."""
        lease, now = self._pick_lease(data), self.model.now
        marked = self._signals.sleep_mark(lease, "sleep-1", now + timedelta(seconds=ends), now)
        job = self.model.holder(lease)
        if job is None:
            assert marked is None
            return
        earlier = self.durable.waits.get(job.id)
        until = (
            earlier.until
            if earlier and earlier.step == "sleep-1"
            else now + timedelta(seconds=ends)
        )
        assert marked == until
        if until <= now:
            self.durable.waits.pop(job.id, None)
            return
        self.durable.waits[job.id] = ModelWait("sleep-1", None, None, until)
        got = self.store.job_finish([Finish.snooze(lease.id, lease.token, until)], now)
        assert got == [lease.id]
        self._park(lease, until)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), ends=st.sampled_from(WAIT_ENDS))
    def wait_for_signal(self, data: st.DataObject, ends: int) -> None:
        """ctx.wait_for: a signal kept is taken; else the wait is marked (an earlier mark
        of the step keeps its time) and times out once over, else parks the job."""
        lease, now = self._pick_lease(data), self.model.now
        holder = self.model.holder(lease)
        step = f"signal-go-{self.durable.ended.get(holder.id, 0) + 1 if holder else 1}"
        waited = self._signals.signal_wait(lease, "go", step, now + timedelta(seconds=ends), now)
        job = self.model.holder(lease)
        if job is None:
            assert waited is None
            return
        assert waited is not None
        if waited.outcome != "parked":
            self.durable.ended[job.id] = self.durable.ended.get(job.id, 0) + 1
        if self.durable.pending.get(job.id, 0):
            assert waited.outcome == "received"
            self.durable.pending[job.id] -= 1
            self.durable.waits.pop(job.id, None)
            return
        earlier = self.durable.waits.get(job.id)
        until = earlier.until if earlier and earlier.step == step else now + timedelta(seconds=ends)
        assert waited.until == until
        if until <= now:
            assert waited.outcome == "timeout"
            self.durable.waits.pop(job.id, None)
            return
        assert waited.outcome == "parked"
        self.durable.waits[job.id] = ModelWait(step, "go", None, until)
        self._park(lease, until)

    @precondition(lambda self: self.leases and self.model.jobs)
    @rule(data=st.data())
    def wait_for_children(self, data: st.DataObject) -> None:
        """ctx.wait: on at once when every child has ended, else parked until it looks again."""
        self._wait_for_children(data)

    @precondition(lambda self: self.leases and self.model.jobs)
    @rule(data=st.data())
    def wait_for_children_again(self, data: st.DataObject) -> None:
        """As often as a claim: parents parked, their children cancelled with them."""
        self._wait_for_children(data)

    def _wait_for_children(self, data: st.DataObject) -> None:
        lease, now = self._pick_lease(data), self.model.now
        ids = sorted(self.model.jobs)
        children = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=2, unique=True))
        until = now + timedelta(seconds=5)
        outcome = self._signals.children_park(lease, "wait-1", children, until, now)
        job = self.model.holder(lease)
        if job is None:
            assert outcome is None
            return
        kids = [self.model.jobs[i] for i in children]
        if not any(kid.state in LIVE for kid in kids):
            assert outcome == "ended"
            self.durable.waits.pop(job.id, None)
            return
        assert outcome == "parked"
        self.durable.waits[job.id] = ModelWait("wait-1", None, children, until)
        self._park(lease, until)

    @rule(data=st.data())
    def send_signal(self, data: st.DataObject) -> None:
        """app.signal: kept for a live job; wakes it when it is parked waiting for it."""
        job_id, now = self._pick_job_id(data, QUEUED, RUNNING), self.model.now
        sent = self._signals.signal_send(job_id, "go", "1", now)
        job = self.model.jobs.get(job_id)
        if job is None:
            assert (sent.state, sent.kept, sent.woken) == (None, False, False)
            return
        assert sent.state == str(job.state) and sent.kept == (job.state in LIVE)
        if not sent.kept:
            return
        self.durable.pending[job_id] = self.durable.pending.get(job_id, 0) + 1
        wait = self.durable.waits.get(job_id)
        woken = job.state == QUEUED and job.run_at > now and wait is not None
        woken = woken and wait is not None and wait.signal == "go"
        assert sent.woken == woken
        if woken:
            job.run_at, job.held_run_at = now, None

    @rule(data=st.data())
    def wake(self, data: st.DataObject) -> None:
        """An operator wakes a parked job: its wait ends now, and it is due now."""
        job_id, now = self._pick_job_id(data, QUEUED), self.model.now
        woken = self._signals.wait_wake(job_id, now)
        job = self.model.jobs.get(job_id)
        wait = self.durable.waits.get(job_id)
        parked = job is not None and job.state == QUEUED and job.run_at > now
        assert woken == (parked and wait is not None and wait.until > now)
        if woken:
            assert job is not None and wait is not None
            wait.until = now
            job.run_at, job.held_run_at = now, None

    def cancel_children(self, job_id: int, was_queued: bool) -> None:
        """After the machine's cancel of ``job_id`` (queued before it, or not): the
        children a queued parent waited for, and theirs, cancelled in the model too."""
        now = self.model.now
        todo = [job_id] if was_queued else []
        seen = set(todo)
        while todo:
            wait = self.durable.waits.get(todo.pop(0))
            for child_id in (wait.children or []) if wait else []:
                child = self.model.jobs.get(child_id)
                if child_id in seen or child is None:
                    continue
                seen.add(child_id)
                if child.state == QUEUED:
                    todo.append(child_id)
                    child.finish(JobState.CANCELLED, now)
                    child.events.append(("cancelled", child.attempts))
                elif child.state == RUNNING and not child.cancel_requested:
                    child.cancel_requested = True
                    child.events.append(("cancel_requested", child.attempts))

    def _parked_parents(self) -> list[int]:
        return [
            job_id
            for job_id, wait in self.durable.waits.items()
            if wait.children and self.model.jobs[job_id].state == QUEUED
        ]

    @precondition(lambda self: self._parked_parents())
    @rule(data=st.data())
    def cancel_parked_parent(self, data: st.DataObject) -> None:
        """An operator cancels a parent parked waiting for its children: they go too."""
        job_id, now = data.draw(st.sampled_from(self._parked_parents())), self.model.now
        got = cancel_one(self.store, job_id, now)
        self.cancel_children(job_id, True)
        job = self.model.jobs[job_id]
        job.finish(JobState.CANCELLED, now)
        job.events.append(("cancelled", job.attempts))
        assert got is not None and got.state == JobState.CANCELLED

    def forget_waits(self, job_ids: list[int]) -> None:
        """Deleted jobs: their waits and signals go with them."""
        for job_id in job_ids:
            self.durable.waits.pop(job_id, None)
            self.durable.pending.pop(job_id, None)

    @invariant()
    def waits_match_model(self) -> None:
        for job_id in self.model.jobs:
            wait = self._signals.job_waiting(job_id)
            want = self.durable.waits.get(job_id)
            got = (
                None
                if wait is None
                else ModelWait(wait.step, wait.signal, wait.children, wait.until)
            )
            assert got == want, job_id
        now = self.model.now
        parked: dict[str, int] = {}
        for job in self.model.jobs.values():
            if job.state == QUEUED and job.run_at > now and job.id in self.durable.waits:
                parked[job.queue] = parked.get(job.queue, 0) + 1
        assert self._signals.parked_counts(now) == parked
