"""Signals and parked waits (``app.signal``, ``ctx.wait_for``; docs/durable.md): the
records they pass and the capability a store offers for them (``SignalStore``).

A signal is a payload sent to a live job under a name, kept until a wait of the
job takes it. A wait that finds no signal parks the job: the store queues it
again for the wait's end (as a snooze does: no attempt, slot or lease used),
and marks what it waits for, so that the signal's own write makes it due at
once. Taking a signal records it as the waiting step in the same transaction
(script on Redis): each signal is taken once, and a replay returns it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from conveyor.job import SEALED_PREFIX, decode_stored
from conveyor.store.records import Lease, Step

#: What a wait came to: a signal taken, its time over, or the job parked until then.
WaitOutcome = Literal["received", "timeout", "parked"]


@dataclass(frozen=True, slots=True)
class SignalWait:
    """What ``signal_wait`` did."""

    outcome: WaitOutcome
    #: When the wait ends (its timeout), as first marked.
    until: datetime
    #: received, timeout: the step recorded for the wait.
    step: Step | None = None


def answered(step: Step) -> SignalWait:
    """A wait whose step is recorded: "received" with the signal's payload, or "timeout"
    when it timed out (a step recorded by an earlier attempt answers as a replay would)."""
    # A timeout is recorded in clear by the store; a sealed result is a payload.
    sealed = step.result_json.startswith(SEALED_PREFIX)
    timed_out = not sealed and _is_timeout(step.result)
    return SignalWait("timeout" if timed_out else "received", step.finished_at, step)


def _is_timeout(result: Any) -> bool:
    return isinstance(result, dict) and "timeout" in result


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a parked job waits for: the step that waits, a signal or children, until
    when; neither a signal nor children: it sleeps (``ctx.sleep``)."""

    step: str
    signal: str | None
    children: list[int] | None
    until: datetime

    @classmethod
    def stored(
        cls, step: str, signal: str | None, children_json: str | None, until: datetime
    ) -> Waiting:
        """A wait as every store keeps it: the children as a JSON list of ids."""
        children = None if children_json is None else [int(i) for i in json.loads(children_json)]
        return cls(step, signal, children, until)


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal sent to a job, and whether (when, by which step) it was taken."""

    id: int
    name: str
    payload_json: str
    sent_at: datetime
    received_at: datetime | None = None
    step: str | None = None

    @property
    def payload(self) -> Any:
        return decode_stored(self.payload_json, f"the payload of signal {self.name!r}")


@dataclass(frozen=True, slots=True)
class Sent:
    """What ``signal_send`` found: the job's state (None: no such job), and whether the
    signal was kept (a live job) and woke the job (parked waiting for it)."""

    state: str | None
    kept: bool
    woken: bool


@runtime_checkable
class SignalStore(Protocol):
    def signal_send(self, job_id: int, name: str, payload_json: str, now: datetime) -> Sent:
        """Keep a signal for a live job, and make it due now if it is parked waiting for
        a signal of that name; a finished or unknown job keeps nothing."""
        ...

    def signal_wait(
        self, lease: Lease, name: str, step: str, until: datetime, now: datetime
    ) -> SignalWait | None:
        """Under the attempt's lease: answer step ``step`` as recorded when it is (a
        replay's answer, no signal taken); else take the oldest signal ``name`` not
        taken yet and record it as step ``step``; else, once the wait's time (``until`` as first
        marked) is over, record the step as timed out; else park the job until then.
        None when the lease no longer holds."""
        ...

    def signal_list(self, job_id: int) -> list[Signal]:
        """The job's signals, in the order they were sent."""
        ...

    def job_waiting(self, job_id: int) -> Waiting | None:
        """What the job waits for, when a wait parked it."""
        ...

    def sleep_mark(
        self, lease: Lease, step: str, until: datetime, now: datetime
    ) -> datetime | None:
        """Under the attempt's lease: mark that the job sleeps (``ctx.sleep``, step
        ``step``) until ``until``, a wait with neither signal nor children; a mark of
        the same step keeps its time (an operator's wake made it now). Once that time
        is not after ``now`` the sleep is over and its wait ends. The time marked;
        None when the lease no longer holds."""
        ...

    def wait_wake(self, job_id: int, now: datetime) -> bool:
        """An operator's wake of a parked job: its wait ends now (a sleep is over, a
        signal's wait times out, a wait for children looks again) and it is due now.
        False unless the job is queued, not due yet, with a wait that ends later."""
        ...

    def parked_counts(self, now: datetime) -> dict[str, int]:
        """Per queue, the jobs a wait parked (sleeping, waiting for a signal or for
        children) that are not due yet; queues with none are left out."""
        ...

    def children_park(
        self, lease: Lease, step: str, children: list[int], until: datetime, now: datetime
    ) -> Literal["ended", "parked"] | None:
        """Under the attempt's lease: 'ended' when every one of ``children`` has ended;
        else mark the wait and park the job until ``until`` (when it looks again).
        None when the lease no longer holds."""
        ...
