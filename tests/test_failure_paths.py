"""Failure paths that must end well: outages during handlers, consumers, forks, bad arguments.

Each test meets the trouble for real, on every store: a database taken away
mid-run (a SQLite file locked by another process, a PostgreSQL server shut
down, a stopped redis-server), a consumer that dies holding a job, a handler
that forks, a job enqueued by name with arguments its handler cannot take.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from conveyor import App, Context, JobState
from conveyor.pacing import LOG_EVERY, DutyBackoff
from outages import STORE_OPTIONS, answering, private_store
from waiting import wait_until

KINDS = ["sqlite", "postgres", "redis"]


def kind_of(dsn: str) -> str:
    return {"sqlite": "sqlite", "postgresql": "postgres", "redis": "redis"}[dsn.split(":")[0]]


# --- one backoff for every duty --------------------------------------------------------


def test_backoff_pauses_grow_to_a_ceiling_and_reset() -> None:
    backoff = DutyBackoff("claim", logging.getLogger("test"), first=0.05, ceiling=1.0)
    pauses = [backoff.failed(RuntimeError("away"), now=100.0) for _ in range(10)]
    assert pauses[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    assert pauses[5:] == [1.0] * 5  # never beyond the ceiling
    assert backoff.retry_at == 101.0 and not backoff.ready(100.5) and backoff.ready(101.0)
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.ready(0.0)
    assert backoff.failed(RuntimeError("again"), now=0.0) == 0.05
    # A thousand failures: still the ceiling, not an overflow.
    for _ in range(1000):
        pause = backoff.failed(RuntimeError("away"), now=0.0)
    assert pause == 1.0


def test_backoff_logs_the_first_failure_then_at_most_every_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backoff = DutyBackoff("lease renewal", logging.getLogger("test.pacing"))
    with caplog.at_level(logging.INFO, logger="test.pacing"):
        for second in range(int(LOG_EVERY * 2) + 1):  # one failure a second for a minute
            backoff.failed(RuntimeError("server closed the connection"), now=float(second))
        backoff.succeeded()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines  # the first, one per LOG_EVERY, and the recovery
    assert "lease renewal failed (attempt 1" in lines[0]
    assert "29 more failure(s) not logged" in lines[1]
    assert lines[-1] == "lease renewal works again after 61 failure(s)"


@pytest.mark.parametrize("first, ceiling", [(0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_a_backoff_that_could_spin_is_refused(first: float, ceiling: float) -> None:
    with pytest.raises(ValueError, match="0 < first <= ceiling"):
        DutyBackoff("x", logging.getLogger("test"), first=first, ceiling=ceiling)


# --- telemetry never fails work ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_progress_through_an_outage_never_fails_the_job(kind: str, tmp_path: Path) -> None:
    """The store goes away while a handler reports progress: the job still succeeds, once."""
    with private_store(kind, tmp_path) as (dsn, away), App(dsn, **STORE_OPTIONS[kind]) as app:
        app.migrate()
        raised: list[BaseException] = []

        @app.task(max_attempts=1)
        def reporting(ctx: Context, seconds: float) -> str:
            deadline = time.monotonic() + seconds
            step = 0
            while time.monotonic() < deadline:
                try:
                    ctx.progress(min(step / 100, 1.0), f"step {step}")
                    ctx.heartbeat()
                except BaseException as exc:
                    raised.append(exc)
                    raise
                step += 1
                time.sleep(0.02)
            return f"{step} steps"

        job = reporting.enqueue(6.0)
        with app.worker(concurrency=2, lease=10, poll_interval=0.2):
            wait_until(lambda: app.get(job.id).progress is not None, 20, "progress is written")
            with away():
                time.sleep(2.5)
            answering(app)
            final = app.wait(job.id, timeout=60)
        assert raised == []
        assert final.endswith(" steps")
        done = app.get(job.id)
        assert done.state == JobState.SUCCEEDED and done.attempts == 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_throttle_during_an_outage_still_retries_the_job(kind: str, tmp_path: Path) -> None:
    with private_store(kind, tmp_path) as (dsn, away), App(dsn, **STORE_OPTIONS[kind]) as app:
        app.migrate()
        outage = threading.Event()
        back = threading.Event()

        @app.task(max_attempts=1)
        def partner(ctx: Context) -> str:
            if ctx.job.run_at <= ctx.job.created_at:  # the first run: told "429" during an outage
                outage.set()
                back.wait(30)
                raise ctx.throttle(0.5)
            return "second run"

        job = partner.enqueue()
        with app.worker(concurrency=1, lease=10, poll_interval=0.2):
            assert outage.wait(20)
            with away():
                back.set()  # the handler throttles while the store is away
                time.sleep(1.5)
            answering(app)
            assert app.wait(job.id, timeout=60) == "second run"
        assert app.get(job.id).state == JobState.SUCCEEDED


# --- consumers: one lease keeper, cancel requests, rescue on a timer -----------------------


def test_a_consumer_renews_through_one_thread_whatever_it_holds(app: App) -> None:
    @app.task
    def item(n: int) -> None:
        return None

    for n in range(30):
        item.enqueue(n)
    before = threading.active_count()
    seen = 0
    counts = []
    for job in app.consume(["default"], lease=1.0, idle_timeout=0.5):
        with job:
            counts.append(threading.active_count())
            seen += 1
    assert seen == 30
    # A lease keeper and a rescuer (and the store's listener) for the whole loop,
    # not a thread per job held.
    assert counts[0] <= before + 3, (before, counts)
    assert max(counts) == counts[0], counts


def test_a_consumer_sees_a_cancel_request_and_the_job_ends_cancelled(app: App) -> None:
    @app.task
    def long(n: int) -> None:
        return None

    job = long.enqueue(1)
    for held in app.consume(["default"], lease=0.6, idle_timeout=0.2):
        with held:
            assert not held.cancelled
            app.cancel(job.id)
            # The lease keeper (every third of the lease) or the local notice says so.
            wait_until(lambda h=held: bool(h.cancelled), 5, "the consumer sees the cancel")
            assert held.cancelled.reason == "cancel"
        break
    assert app.get(job.id).state == JobState.CANCELLED


def test_a_consumer_learns_that_its_lease_was_lost(app: App) -> None:
    @app.task
    def slow(n: int) -> None:
        return None

    job = slow.enqueue(1)
    for held in app.consume(["default"], lease=0.6, idle_timeout=0.2):
        # Another party takes the job back (an operator, or a rescuer that judged it dead).
        app.take_back(ids=[job.id])
        wait_until(lambda h=held: bool(h.cancelled), 5, "the consumer learns its lease is gone")
        assert held.cancelled.reason == "lease lost"
        held.ended = True  # nothing to record: the job is someone else's now
        break


@pytest.mark.slow
def test_a_busy_consumer_takes_back_a_dead_consumers_job_about_one_lease_later(app: App) -> None:
    """300 other jobs queued and a steady stream: the dead consumer's job comes back anyway."""

    @app.task
    def step(n: int) -> None:
        return None

    lost = step.options(group="conversation").enqueue(-1)
    # A consumer claims it and dies: nobody renews its 1 s lease.
    (claimed,) = app.store.job_claim(["default"], 1, "dead-consumer", timedelta(seconds=1))
    assert claimed.id == lost.id
    follower = step.options(group="conversation").enqueue(-2)
    for n in range(300):
        step.enqueue(n)
    order: list[int] = []
    started = time.monotonic()
    came_back_after: float | None = None
    for held in app.consume(["default"], lease=1.0, idle_timeout=0.5):
        with held:
            order.append(held.id)
            if held.id == lost.id:
                came_back_after = time.monotonic() - started
            time.sleep(0.02)  # busy: 300 jobs take six seconds or more
            if len(order) % 20 == 0:
                step.enqueue(1000 + len(order))  # and more keep coming
        if len(order) >= 340:
            break
    assert came_back_after is not None, "the dead consumer's job never came back"
    # About one lease after its lease expired (the rescuer looks every quarter lease).
    assert came_back_after < 3.0, came_back_after
    assert order.index(lost.id) < 150
    # Its group went on in order once it was done.
    assert order.index(follower.id) > order.index(lost.id)
    assert app.get(lost.id).state == JobState.SUCCEEDED


# --- handlers that fork -------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_that_calls_sys_exit_exits(app: App) -> None:
    @app.task
    def forking(code: int) -> int:
        pid = os.fork()
        if pid == 0:
            sys.exit(code)  # the child: must end here, not go back into the worker
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    @app.task
    def forking_returns() -> int:
        pid = os.fork()
        if pid == 0:
            return -1  # the child returns from the handler: it exits 0
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    jobs = [forking.enqueue(7), forking.enqueue(0), forking_returns.enqueue()]
    with app.worker(concurrency=2, poll_interval=0.2):
        results = [app.wait(job.id, timeout=30) for job in jobs]
    assert results == [7, 0, 0]
    # Exactly one outcome per job: the children recorded nothing.
    for job in jobs:
        assert [e.kind for e in app.events(job.id)] == ["enqueued", "claimed", "succeeded"]


# --- arguments that cannot bind ---------------------------------------------------------


def test_arguments_that_do_not_fit_the_handler_fail_at_once(app: App) -> None:
    calls: list[int] = []

    @app.task(max_attempts=5)
    def square(ctx: Context, n: int) -> int:
        calls.append(n)
        return n * n

    @app.task(max_attempts=5)
    def broken_inside(n: int) -> int:
        return len(n)  # type: ignore[arg-type]  # a TypeError of the handler's own

    # Enqueued by name, as another service or the CLI without --app would.
    wrong = app.enqueue("square", kwargs={"item_id": 3})
    missing = app.enqueue("square")
    fine = app.enqueue("square", args=[4])
    inside = app.enqueue("broken_inside", args=[3])
    with app.worker(concurrency=2, poll_interval=0.2):
        assert app.wait(fine.id, timeout=30) == 16
        wait_until(lambda: app.get(wrong.id).state == JobState.FAILED, 30, "wrong fails")
        wait_until(lambda: app.get(missing.id).state == JobState.FAILED, 30, "missing fails")
        wait_until(lambda: app.get(inside.id).attempts >= 2, 30, "the handler's own error retries")
    failed = app.get(wrong.id)
    assert failed.attempts == 1  # no retry: it would fail the same way every time
    assert failed.error == (
        "InvalidJobError: arguments do not fit task 'square': unexpected keyword argument(s) "
        "'item_id'; missing argument(s) 'n'; it takes square(n) (not retried)"
    )
    assert "missing argument(s) 'n'; it takes square(n)" in (app.get(missing.id).error or "")
    assert app.get(missing.id).attempts == 1
    assert calls == [4]
