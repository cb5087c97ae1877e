"""The state machine's rows for signals and parked waits (docs/architecture.md), as
tests/test_state_machine_doc.py performs them: each takes its Bench and returns the
job it acted on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from conveyor.job import Job
from conveyor.store.records import Finish, Lease
from conveyor.store.signals import SignalStore

if TYPE_CHECKING:
    from test_state_machine_doc import Bench


def _now() -> Any:
    from test_state_machine_doc import NOW

    return NOW


def _lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def wait_for_signal(sent: bool, late: bool = False) -> Callable[[Bench], Job]:
    def run(bench: Bench) -> Job:
        job = bench.claim(bench.enqueue())
        store = cast(SignalStore, bench.store)
        if sent:
            assert store.signal_send(job.id, "go", "1", _now()).kept
        until = _now() + timedelta(hours=-1 if late else 1)
        waited = store.signal_wait(_lease(job), "go", "signal-go-1", until, _now())
        assert waited is not None
        expected = "received" if sent else "timeout" if late else "parked"
        assert waited.outcome == expected
        return job

    return run


def signal_parked(bench: Bench) -> Job:
    job = wait_for_signal(sent=False)(bench)
    store = cast(SignalStore, bench.store)
    sent = store.signal_send(job.id, "go", '"x"', _now())
    assert sent.kept and sent.woken
    (after,) = bench.store.job_get_many([job.id])
    assert after.run_at <= _now()
    return job


def wait_for_children(live: bool) -> Callable[[Bench], Job]:
    def run(bench: Bench) -> Job:
        child = bench.enqueue()
        if not live:
            bench.store.job_cancel_many([child.id], _now())  # type: ignore[attr-defined]
        parent = bench.claim(bench.enqueue())
        store = cast(SignalStore, bench.store)
        until = _now() + timedelta(seconds=5)
        parked = store.children_park(_lease(parent), "wait-1", [child.id], until, _now())
        assert parked == ("parked" if live else "ended")
        return parent

    return run


def sleep(over: bool) -> Callable[[Bench], Job]:
    """ctx.sleep: the wait marked, then the worker's snooze to its time (or, its time
    over, the wait ended and the job runs on)."""

    def run(bench: Bench) -> Job:
        job = bench.claim(bench.enqueue())
        store = cast(SignalStore, bench.store)
        until = _now() + timedelta(hours=-1 if over else 1)
        assert store.sleep_mark(_lease(job), "sleep-1", until, _now()) == until
        waits = store.job_waiting(job.id)
        if over:
            assert waits is None
            return job
        assert waits is not None and (waits.signal, waits.children) == (None, None)
        assert job.lease_token is not None
        snooze = Finish.snooze(job.id, job.lease_token, until)
        assert bench.store.job_finish([snooze], _now()) == [job.id]
        return job

    return run


def wake_parked(bench: Bench) -> Job:
    job = sleep(over=False)(bench)
    store = cast(SignalStore, bench.store)
    assert store.wait_wake(job.id, _now())
    (after,) = bench.store.job_get_many([job.id])
    waits = store.job_waiting(job.id)
    assert after.run_at <= _now() and waits is not None and waits.until <= _now()
    return job


def cancel_parked_parent(bench: Bench) -> Job:
    parent = wait_for_children(live=True)(bench)
    waits = cast(SignalStore, bench.store).job_waiting(parent.id)
    assert waits is not None and waits.children
    cancelled = bench.store.job_cancel_many([parent.id], _now())  # type: ignore[attr-defined]
    assert sorted(cancelled) == sorted([parent.id, *waits.children])
    children = bench.store.job_get_many(waits.children)
    assert {str(child.state) for child in children} == {"cancelled"}
    return parent


ACTIONS: dict[tuple[str, str], Callable[[Bench], Job]] = {
    ("running", "wait for a signal, none sent"): wait_for_signal(sent=False),
    ("running", "wait for a signal, one sent"): wait_for_signal(sent=True),
    ("running", "wait for a signal, its time over"): wait_for_signal(sent=False, late=True),
    ("queued", "signal a job parked waiting for it"): signal_parked,
    ("running", "wait for children, one live"): wait_for_children(live=True),
    ("running", "wait for children, all ended"): wait_for_children(live=False),
    ("running", "sleep"): sleep(over=False),
    ("running", "sleep, its time over"): sleep(over=True),
    ("queued", "wake a parked job"): wake_parked,
    ("queued", "cancel a parent parked waiting for children"): cancel_parked_parent,
}
