"""A signal is never taken without being recorded: a wait whose step is recorded
already (an earlier attempt's) answers that step, as a replay does, and leaves the
signals kept for the next step; on every store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.job import NewJob
from conveyor.store.protocols import Store
from conveyor.store.records import Lease
from conveyor.store.signals import SignalStore

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
LATER = NOW + timedelta(seconds=60)


def _running(store: Store) -> Lease:
    (job,) = store.job_insert_many([NewJob("q", "t", "[]", "{}", run_at=NOW)], NOW)
    (claimed,) = store.job_claim(["q"], 1, "w", LEASE, NOW)
    assert claimed.id == job.id
    return Lease(job.id, claimed.lease_token or "")


def test_a_recorded_step_takes_no_second_signal(store: Store) -> None:
    assert isinstance(store, SignalStore)
    lease = _running(store)
    for payload in ('"first"', '"second"'):
        assert store.signal_send(lease.id, "go", payload, NOW).kept

    first = store.signal_wait(lease, "go", "signal-go-1", LATER, NOW)
    assert first is not None and first.outcome == "received"
    assert first.step is not None and first.step.result == {"payload": "first"}
    # The same step again (a replay that asks the store): the recorded step, and the
    # second signal stays kept.
    again = store.signal_wait(lease, "go", "signal-go-1", LATER, NOW + timedelta(seconds=1))
    assert again is not None and again.outcome == "received"
    assert again.step is not None and again.step.result == {"payload": "first"}
    kept = store.signal_list(lease.id)
    assert [(s.payload, s.step) for s in kept] == [("first", "signal-go-1"), ("second", None)]
    assert kept[1].received_at is None

    second = store.signal_wait(lease, "go", "signal-go-2", LATER, NOW)
    assert second is not None and second.outcome == "received"
    assert second.step is not None and second.step.result == {"payload": "second"}
    assert [s.step for s in store.signal_list(lease.id)] == ["signal-go-1", "signal-go-2"]


def test_a_step_recorded_as_timed_out_answers_so_and_keeps_the_signal(store: Store) -> None:
    assert isinstance(store, SignalStore)
    lease = _running(store)
    timed_out = store.signal_wait(lease, "go", "signal-go-1", NOW, NOW)
    assert timed_out is not None and timed_out.outcome == "timeout"
    assert store.signal_send(lease.id, "go", '"late"', NOW).kept

    again = store.signal_wait(lease, "go", "signal-go-1", LATER, NOW)
    assert again is not None and again.outcome == "timeout"
    assert store.job_waiting(lease.id) is None
    (late,) = store.signal_list(lease.id)
    assert late.received_at is None and late.step is None
    taken = store.signal_wait(lease, "go", "signal-go-2", LATER, NOW)
    assert taken is not None and taken.outcome == "received"
    assert taken.step is not None and taken.step.result == {"payload": "late"}
