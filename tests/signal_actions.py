"""The state machine's rows for signals and parked waits (docs/architecture.md), as
tests/test_state_machine_doc.py performs them: each takes its Bench and returns the
job it acted on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from conveyor.job import Job
from conveyor.store.records import Lease
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


ACTIONS: dict[tuple[str, str], Callable[[Bench], Job]] = {
    ("running", "wait for a signal, none sent"): wait_for_signal(sent=False),
    ("running", "wait for a signal, one sent"): wait_for_signal(sent=True),
    ("running", "wait for a signal, its time over"): wait_for_signal(sent=False, late=True),
    ("queued", "signal a job parked waiting for it"): signal_parked,
    ("running", "wait for children, one live"): wait_for_children(live=True),
    ("running", "wait for children, all ended"): wait_for_children(live=False),
}
