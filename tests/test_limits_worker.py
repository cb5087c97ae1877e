"""Limits as a worker meets them: idle while held back, woken at once, pushed back by a handler.

Workers run in this process (a background thread each) on both backends; the
workers of many processes are in test_limits_fleet.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from conveyor import App, Context, JobState
from conveyor.store.postgres import listener as pg_listener

T = TypeVar("T")
DEADLINE = 20.0


def wait_until(condition: Callable[[], T], timeout: float = DEADLINE) -> T:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.01)
    return value


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


class Counting:
    """Counts calls of one store method (the store itself runs as usual)."""

    def __init__(self, app: App, name: str) -> None:
        self.calls = 0
        original = getattr(app.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        setattr(app.store, name, counted)


def claimed_at(app: App, job_ids: list[int]) -> list[float]:
    """When each job was claimed (its first claim), as epoch seconds, in order."""
    times = []
    for job_id in job_ids:
        claims = [e.at for e in app.events(job_id) if e.kind == "claimed"]
        times.append(claims[0].timestamp())
    return sorted(times)


def test_a_worker_held_back_by_a_rate_sleeps_until_the_window_slides(app: App) -> None:
    @app.task(queue="paced")
    def tick() -> None:
        return None

    app.limit("paced", rate="2/s")
    jobs = tick.enqueue_many([((), {})] * 6)
    claims = Counting(app, "job_claim")
    with app.worker(concurrency=4, poll_interval=30, maintenance=False):
        started = time.monotonic()
        for job in jobs:
            job.wait(timeout=DEADLINE)
        took = time.monotonic() - started
    times = claimed_at(app, [j.id for j in jobs])
    # Two per window: the third and fifth wait for the first and third to leave it.
    assert times[2] - times[0] >= 1.0
    assert times[4] - times[2] >= 1.0
    # With a 30 s poll, only the timer set to the window's slide makes this quick...
    assert took < 4.0, took
    # ...and the worker slept meanwhile: a claim per window and a wake or two, not a
    # poll loop (which would claim hundreds of times a second).
    assert claims.calls <= 15, claims.calls


def test_a_freed_concurrency_slot_wakes_a_waiting_worker_at_once(dsn: str) -> None:
    """Two Apps, as two processes would have: one's finished job wakes the other."""
    first, second = App(dsn), App(dsn)
    first.migrate()
    try:
        handlers: list[Any] = []
        for app in (first, second):

            @app.task(queue="exports")
            def export(seconds: float) -> list[float]:
                begun = time.time()
                time.sleep(seconds)
                return [begun, time.time()]

            handlers.append(export)
        first.limit("exports", concurrency=1)
        jobs = handlers[0].enqueue_many([((0.2,), {})] * 4)
        claims = [Counting(first, "job_claim"), Counting(second, "job_claim")]
        with (
            first.worker(concurrency=4, poll_interval=30, maintenance=False),
            second.worker(concurrency=4, poll_interval=30, maintenance=False),
        ):
            spans = sorted(first.wait(job.id, timeout=DEADLINE) for job in jobs)
        workers = {first.get(job.id).worker for job in jobs}
    finally:
        first.close()
        second.close()
    # One at a time, and the next starts as soon as a slot is free (the 30 s poll
    # would leave a gap of seconds).
    for earlier, later in itertools.pairwise(spans):
        assert later[0] >= earlier[1] - 0.01, spans
        assert later[0] - earlier[1] < 0.5, spans
    assert len(workers) >= 1
    # Woken, not polling: a few claims per job at most.
    assert sum(c.calls for c in claims) <= 40, [c.calls for c in claims]


def test_a_throttle_from_a_handler_holds_back_its_key_for_every_worker(app: App) -> None:
    throttled = threading.Event()

    @app.task(queue="partner")
    def call(ctx: Context, n: int) -> float:
        if ctx.job.limit_key == "k1" and not throttled.is_set():
            throttled.set()
            raise ctx.throttle(1.0)  # the partner said 429, retry after 1 s
        return time.time()

    # One at a time per key, so that k1's other jobs come after the throttle.
    app.limit("partner", concurrency=1, per_key=True)
    k1 = [call.options(limit_key="k1").enqueue(n) for n in range(3)]
    k2 = [call.options(limit_key="k2").enqueue(n) for n in range(2)]
    with app.worker(concurrency=4, poll_interval=30, maintenance=False):
        k2_done = [app.wait(job.id, timeout=DEADLINE) for job in k2]
        assert throttled.wait(DEADLINE)
        until = time.time() + 0.9  # the throttle ends about a second after it was set
        k1_done = [app.wait(job.id, timeout=DEADLINE) for job in k1]
    # Key k2 went on meanwhile; key k1 waited out the throttle, the throttling job too.
    assert all(t < until for t in k2_done)
    assert all(t >= until - 0.2 for t in k1_done), (k1_done, until)
    first = app.get(k1[0].id)
    assert first.state == JobState.SUCCEEDED
    assert first.attempts == 1  # a throttle's retry does not use up an attempt
    assert [e.kind for e in app.events(first.id)].count("snoozed") == 1


def test_a_throttle_of_a_job_without_a_key_holds_back_the_queue(app: App) -> None:
    seen: list[str] = []

    @app.task(queue="bulk")
    def push(ctx: Context, name: str) -> None:
        seen.append(name)
        if name == "first":
            ctx.throttle(0.6)  # the job itself succeeds; the queue waits

    first = push.enqueue("first")
    with app.worker(concurrency=1, poll_interval=30, maintenance=False):
        first.wait(timeout=DEADLINE)
        second = push.enqueue("second")
        time.sleep(0.3)
        assert app.get(second.id).state == JobState.QUEUED
        status = app.limits()["bulk"]
        assert status.throttled_until is not None and status.held_back == 1
        second.wait(timeout=DEADLINE)
    assert seen == ["first", "second"]


def test_a_limit_changed_while_workers_run_counts_from_their_next_claim(app: App) -> None:
    release = threading.Event()

    @app.task(queue="jobs")
    def hold() -> None:
        release.wait(DEADLINE)

    app.limit("jobs", concurrency=1)
    jobs = hold.enqueue_many([((), {})] * 4)
    try:
        with app.worker(concurrency=8, poll_interval=30, maintenance=False):
            wait_until(lambda: app.count_jobs(queue="jobs").get("running") == 1)
            time.sleep(0.2)
            assert app.count_jobs(queue="jobs").get("running") == 1
            app.limit("jobs", concurrency=3)  # raised: the workers hear of it
            wait_until(lambda: app.count_jobs(queue="jobs").get("running") == 3)
            app.limit("jobs", clear=True)  # cleared
            wait_until(lambda: app.count_jobs(queue="jobs").get("running") == 4)
            release.set()
            for job in jobs:
                job.wait(timeout=DEADLINE)
    finally:
        release.set()


def test_drain_obeys_limits_and_dates_starts_now(app: App) -> None:
    from conveyor.testing import drain

    @app.task(queue="paced")
    def tick() -> None:
        return None

    app.limit("paced", rate="2/m")
    jobs = tick.enqueue_many([((), {})] * 3)
    assert drain(app, ["paced"], with_scheduled=True) == {"succeeded": 2}
    assert [app.get(j.id).state for j in jobs].count(JobState.QUEUED) == 1
    # The starts were dated now, not "as of" the far future drain can claim at:
    # the window slides as usual, so lifting the limit is all it takes.
    status = app.limits()["paced"]
    assert (status.started, status.held_back) == (2, 1)
    app.limit("paced", clear=True)
    assert drain(app, ["paced"]) == {"succeeded": 1}
