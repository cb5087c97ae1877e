"""Prefetch: jobs claimed beyond the free slots wait, held, for a slot; on both backends.

What a prefetched job must never do: run beside more than ``concurrency``
others, run after it was cancelled, or stay held when the worker stops.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from conveyor import App, JobCancelled, JobState
from conveyor.store.finish_fetch import FinishFetchStore
from conveyor.store.postgres import listener as pg_listener
from waiting import wait_until

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


class Gate:
    """A handler body that blocks until opened and records how many ran at once."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.ran: list[int] = []
        self.most_at_once = 0
        self._now = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> int:
        with self._lock:
            self._now += 1
            self.most_at_once = max(self.most_at_once, self._now)
            self.ran.append(n)
        try:
            self.open.wait(DEADLINE)
        finally:
            with self._lock:
                self._now -= 1
        return n


def running_count(app: App, queue: str) -> int:
    return app.count_jobs(queue=queue).get("running", 0)


def test_prefetched_jobs_are_held_but_never_run_beyond_the_concurrency(app: App) -> None:
    gate = Gate()
    step = app.task(queue="pf", name="step")(gate)
    jobs = [step.enqueue(n) for n in range(6)]
    with app.worker(queues=["pf"], concurrency=1, prefetch=3, maintenance=False):
        wait_until(lambda: gate.ran, what="the first handler started")
        # One slot and three more held: four leased, one running its handler.
        wait_until(lambda: running_count(app, "pf") == 4, what="four jobs claimed")
        assert gate.ran == [0]
        gate.open.set()
        assert [job.wait(timeout=DEADLINE) for job in jobs] == list(range(6))
    assert gate.most_at_once == 1
    assert gate.ran == list(range(6))  # in claim order


def test_without_prefetch_a_claim_takes_only_the_free_slots(app: App) -> None:
    gate = Gate()
    step = app.task(queue="pf", name="step")(gate)
    jobs = [step.enqueue(n) for n in range(3)]
    with app.worker(queues=["pf"], concurrency=1, maintenance=False):
        wait_until(lambda: gate.ran, what="the first handler started")
        assert running_count(app, "pf") == 1
        gate.open.set()
        for job in jobs:
            job.wait(timeout=DEADLINE)


def test_a_cancelled_prefetched_job_ends_without_running(app: App) -> None:
    gate = Gate()
    step = app.task(queue="pf", name="step")(gate)
    first, second = step.enqueue(1), step.enqueue(2)
    with app.worker(queues=["pf"], concurrency=1, prefetch=1, maintenance=False):
        wait_until(lambda: running_count(app, "pf") == 2, what="both jobs claimed")
        app.cancel(second.id)
        with pytest.raises(JobCancelled):
            second.wait(timeout=DEADLINE)
        gate.open.set()
        assert first.wait(timeout=DEADLINE) == 1
    assert gate.ran == [1]
    assert app.get(second.id).state == JobState.CANCELLED


def test_a_stopping_worker_gives_prefetched_jobs_back_at_once(app: App) -> None:
    gate = Gate()
    step = app.task(queue="pf", name="step")(gate)
    first = step.enqueue(1)
    rest = [step.enqueue(n) for n in (2, 3)]
    worker = app.worker(queues=["pf"], concurrency=1, prefetch=2, maintenance=False)
    worker.start()
    try:
        wait_until(lambda: running_count(app, "pf") == 3, what="three jobs claimed")
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        # The drain waits for the running handler only: the others are queued
        # again before it returns, with their attempt given back.
        wait_until(
            lambda: all(app.get(j.id).state == JobState.QUEUED for j in rest),
            what="prefetched jobs released",
        )
        assert all(app.get(j.id).attempts == 0 for j in rest)
        assert app.get(first.id).state == JobState.RUNNING
        gate.open.set()
        stopper.join(DEADLINE)
    finally:
        gate.open.set()
        worker.stop()
    assert first.wait(timeout=DEADLINE) == 1
    assert gate.ran == [1]


@pytest.mark.parametrize("prefetch", [0, 9])
def test_prefetch_fills_its_room_in_few_claims(app: App, prefetch: int) -> None:
    @app.task(queue="pf")
    def noop() -> None:
        return None

    claimed: list[int] = []
    original = app.store.job_claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        jobs = original(*args, **kwargs)
        if jobs:
            claimed.append(len(jobs))
        return jobs

    app.store.job_claim = counted  # type: ignore[method-assign]
    if isinstance(app.store, FinishFetchStore):  # finishes claim the next jobs too (Redis)
        finish_fetch = app.store.job_finish_fetch

        def counted_fetch(*args: Any, **kwargs: Any) -> Any:
            ids, jobs = finish_fetch(*args, **kwargs)
            if jobs:
                claimed.append(len(jobs))
            return ids, jobs

        app.store.job_finish_fetch = counted_fetch  # type: ignore[method-assign]
    noop.enqueue_many([((), {})] * 30)
    app.run_worker(queues=["pf"], concurrency=1, prefetch=prefetch, burst=True, maintenance=False)
    assert sum(claimed) == 30
    if prefetch:
        # A claim waits until at most one job is left waiting, then takes the room.
        assert len(claimed) <= 6, claimed
    else:
        assert claimed == [1] * 30


def test_the_start_line_names_the_prefetch(app: App, caplog: pytest.LogCaptureFixture) -> None:
    @app.task(queue="pf")
    def noop() -> None:
        return None

    with caplog.at_level("INFO", logger="conveyor.worker"):
        app.run_worker(queues=["pf"], concurrency=2, prefetch=5, burst=True, maintenance=False)
    assert "concurrency 2 (+5 prefetched)" in caplog.text


def test_prefetch_must_not_be_negative(app: App) -> None:
    with pytest.raises(ValueError, match="prefetch"):
        app.worker(queues=["pf"], prefetch=-1)
