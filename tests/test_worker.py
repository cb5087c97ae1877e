"""The worker on both backends: handlers, outcomes, leases, cancels, wakeups, drain, maintenance.

Every test runs a real worker in a thread against a real database. Latencies are
measured from the history the store records (``events.at``) and from the jobs'
own ``run_at``, not from sleeps in the test.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor import (
    App,
    Context,
    Fail,
    FixedBackoff,
    JobCancelled,
    JobFailed,
    JobState,
    Retry,
)
from conveyor.job import Event, utcnow
from conveyor.store.postgres import listener as pg_listener
from conveyor.store.records import Finish
from conveyor.worker.maintenance import Maintenance
from store_fixtures import sql_only
from waiting import wait_until

#: Longest any condition in these tests may take to come true.
DEADLINE = 10.0


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


def events_of(app: App, job_id: int, kind: str) -> list[Event]:
    return [e for e in app.events(job_id) if e.kind == kind]


def seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing an App waits for its LISTEN thread, which looks for a stop every ``_WAIT`` s."""
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:
        application.migrate()
        yield application


class _NoFeed:
    """A subscription that never reports anything (the database feed switched off)."""

    def close(self) -> None:
        pass


# --- handlers and results -----------------------------------------------------------


def test_sync_and_async_handlers_store_their_results(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    @app.task
    async def mul(a: int, b: int) -> dict[str, int]:
        await asyncio.sleep(0.01)
        return {"product": a * b}

    @app.task
    def nothing() -> None:
        return None

    with app.worker(concurrency=4, lease=5):
        jobs = [add.enqueue(1, 2), mul.enqueue(3, 4), nothing.enqueue()]
        assert jobs[0].wait(timeout=DEADLINE) == 3
        assert jobs[1].wait(timeout=DEADLINE) == {"product": 12}
        assert jobs[2].wait(timeout=DEADLINE) is None
    for job in jobs:
        done = app.get(job.id)
        assert done.state == JobState.SUCCEEDED
        assert done.attempts == 1
        assert done.error is None
        assert done.started_at is not None and done.finished_at is not None
        assert kinds(app, job.id) == ["enqueued", "claimed", "succeeded"]


def test_context_progress_and_heartbeat(app: App) -> None:
    seen: dict[str, Any] = {}
    proceed = threading.Event()

    @app.task
    def report(ctx: Context, n: int) -> int:
        seen["sync"] = (ctx.job_id, ctx.attempt, ctx.cancelled.is_set())
        assert ctx.progress(0.5, "half")
        seen["heartbeat"] = ctx.heartbeat()
        proceed.wait(DEADLINE)
        return n * 10

    @app.task
    async def areport(ctx: Context) -> str:
        seen["async"] = (ctx.job_id, ctx.attempt)
        ctx.progress(None, "only a message")
        return "ok"

    with app.worker(concurrency=4, lease=5):
        job = report.enqueue(4)
        running = wait_until(lambda: (j := app.get(job.id)).progress is not None and j)
        assert running.state == JobState.RUNNING
        assert running.progress == 0.5
        assert running.progress_message == "half"
        proceed.set()
        assert job.wait(timeout=DEADLINE) == 40
        ajob = areport.enqueue()
        assert ajob.wait(timeout=DEADLINE) == "ok"
    assert seen["sync"] == (job.id, 1, False)
    assert seen["heartbeat"] is True
    assert seen["async"] == (ajob.id, 1)
    assert app.get(ajob.id).progress_message == "only a message"


def test_progress_fraction_out_of_range_fails_the_attempt(sqlite_app: App) -> None:
    app = sqlite_app

    @app.task(max_attempts=1)
    def bad(ctx: Context) -> None:
        ctx.progress(1.5)

    with app.worker(concurrency=1, lease=5):
        job = bad.enqueue()
        with pytest.raises(JobFailed, match="between 0 and 1"):
            job.wait(timeout=DEADLINE)


# --- Retry, Fail, exceptions ------------------------------------------------------


def test_retry_snoozes_without_using_an_attempt(app: App) -> None:
    calls: list[int] = []

    @app.task(max_attempts=1)
    def poll() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise Retry(0.05)
        return "ready"

    with app.worker(concurrency=2, lease=5):
        job = poll.enqueue()
        assert job.wait(timeout=DEADLINE) == "ready"
    done = app.get(job.id)
    assert done.attempts == 1  # two snoozes used up nothing, even with max_attempts=1
    assert len(calls) == 3
    assert kinds(app, job.id) == [
        "enqueued", "claimed", "snoozed", "claimed", "snoozed", "claimed", "succeeded",
    ]  # fmt: skip


def test_fail_fails_at_once(app: App) -> None:
    @app.task(max_attempts=5)
    def reject(order: int) -> None:
        raise Fail(f"order {order} rejected")

    with app.worker(concurrency=2, lease=5):
        job = reject.enqueue(7)
        with pytest.raises(JobFailed, match="order 7 rejected") as info:
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert done.state == JobState.FAILED
    assert done.attempts == 1
    assert "order 7 rejected" in (done.error or "")
    assert info.value.error == done.error
    assert kinds(app, job.id) == ["enqueued", "claimed", "failed"]


def test_exceptions_retry_with_backoff_then_fail_with_the_traceback(app: App) -> None:
    attempts: list[int] = []

    @app.task(max_attempts=3, backoff=FixedBackoff(0.05))
    def flaky(ctx: Context) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"boom on attempt {ctx.attempt}")

    with app.worker(concurrency=2, lease=5):
        job = flaky.enqueue()
        with pytest.raises(JobFailed, match="boom on attempt 3") as info:
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert attempts == [1, 2, 3]
    assert done.state == JobState.FAILED
    assert done.attempts == 3
    assert done.error is not None
    assert done.error.startswith("Traceback (most recent call last):")
    assert "ValueError: boom on attempt 3" in done.error
    assert "in flaky" in done.error
    assert info.value.error == done.error
    history = app.events(job.id)
    assert [e.kind for e in history] == [
        "enqueued", "claimed", "retried", "claimed", "retried", "claimed", "failed",
    ]  # fmt: skip
    retried = [e for e in history if e.kind == "retried"]
    assert "boom on attempt 1" in (retried[0].error or "")
    # The backoff was respected: each retry ran at least 50 ms after the failed attempt
    # began (its retry time is the failure's time plus the backoff).
    claims = [e for e in history if e.kind == "claimed"]
    for earlier, later in itertools.pairwise(claims):
        assert seconds(later.at, earlier.at) >= 0.05


# --- poison jobs ------------------------------------------------------------------


def test_unknown_task_is_passed_on_and_the_queue_goes_on(app: App) -> None:
    @app.task
    def known(n: int) -> int:
        return n + 1

    stranger = app.enqueue("not_registered_here", [1], max_attempts=5)
    good = [known.enqueue(n) for n in range(3)]
    assert app.run_worker(burst=True, concurrency=2, lease=5) == 0
    # Another worker of the fleet may know the task: queued again for later,
    # its attempt given back (tests/test_worker_fleet.py runs such a fleet).
    passed_on = app.get(stranger.id)
    (snoozed,) = events_of(app, stranger.id, "snoozed")
    assert passed_on.state == JobState.QUEUED and passed_on.run_at > snoozed.at
    assert passed_on.attempts == 0
    assert "no task named 'not_registered_here' is registered" in (passed_on.error or "")
    assert kinds(app, stranger.id) == ["enqueued", "claimed", "snoozed"]
    assert [app.get(j.id).result for j in good] == [1, 2, 3]


def test_unknown_task_fails_at_once_without_patience(app: App) -> None:
    stranger = app.enqueue("not_registered_here", [1], queue="default", max_attempts=5)
    worker = app.worker(queues=["default"], burst=True, unknown_task_patience=0)
    with worker:
        assert worker.wait_stopped(30)
    failed = app.get(stranger.id)
    assert failed.state == JobState.FAILED
    assert failed.attempts == 1
    assert "no worker knew task 'not_registered_here'" in (failed.error or "")
    assert kinds(app, stranger.id) == ["enqueued", "claimed", "failed"]


def test_undecodable_payload_fails_at_once_and_the_queue_goes_on(sqlite_app: App) -> None:
    app = sqlite_app

    @app.task
    def echo(*args: Any, **kwargs: Any) -> list[Any]:
        return [list(args), kwargs]

    broken_args = echo.options(max_attempts=5).enqueue(1)
    broken_kwargs = echo.options(max_attempts=5).enqueue(2)
    not_a_list = echo.options(max_attempts=5).enqueue(3)
    fine = echo.enqueue(4, x=5)
    path = app.store.path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET args = '[1, ' WHERE id = ?", (broken_args.id,))
        conn.execute("UPDATE jobs SET kwargs = '{\"a\": }' WHERE id = ?", (broken_kwargs.id,))
        conn.execute("UPDATE jobs SET args = '{\"a\": 1}' WHERE id = ?", (not_a_list.id,))
    conn.close()
    assert app.run_worker(burst=True, concurrency=2, lease=5) == 0
    for job in (broken_args, broken_kwargs, not_a_list):
        failed = app.get(job.id)
        assert failed.state == JobState.FAILED, failed
        assert failed.attempts == 1
        assert (failed.error or "").startswith("undecodable payload"), failed.error
    assert "not a JSON array" in (app.get(not_a_list.id).error or "")
    assert app.get(fine.id).result == [[4], {"x": 5}]


def test_a_result_that_is_not_json_fails_the_job(app: App) -> None:
    calls: list[int] = []

    @app.task(max_attempts=3, backoff=FixedBackoff(0.05))
    def give_set() -> set[int]:
        calls.append(1)
        return {1, 2}

    with app.worker(concurrency=2, lease=5):
        job = give_set.enqueue()
        with pytest.raises(JobFailed, match="return value cannot be stored"):
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert "JSON" in (done.error or "")
    # A handler that returns something unstorable will do so again: no retries,
    # which would only repeat its side effects.
    assert done.attempts == 1
    assert len(calls) == 1


def test_a_nul_character_in_an_outcome_does_not_wedge_the_worker(app: App) -> None:
    """NUL is valid in Python text and JSON ("\\u0000"), but PostgreSQL text refuses it.

    Whatever the store makes of such an outcome, it must not hold up the outcomes
    of other jobs.
    """

    @app.task(max_attempts=1)
    def bad_error() -> None:
        raise ValueError("before\x00after")

    @app.task(max_attempts=1)
    def bad_result() -> str:
        return "before\x00after"

    @app.task
    def fine(n: int) -> int:
        return n

    # (stop_timeout=1: a worker whose outcomes cannot be written gives up after 10 s)
    with app.worker(concurrency=4, lease=5, stop_timeout=1):
        jobs = [bad_error.enqueue(), bad_result.enqueue()]
        others = [fine.enqueue(n) for n in range(3)]
        assert [j.wait(timeout=5) for j in others] == [0, 1, 2]
        for job in jobs:
            wait_until(lambda job=job: app.get(job.id).terminal, timeout=5)
        more = fine.enqueue(3)
        assert more.wait(timeout=5) == 3
    failed = app.get(jobs[0].id)
    assert failed.state == JobState.FAILED
    assert "before" in (failed.error or "") and "after" in (failed.error or "")


REFUSE_POISON = {
    "sqlite": [
        """CREATE TRIGGER refuse_poison BEFORE UPDATE ON jobs WHEN NEW.result LIKE '%poison%'
           BEGIN SELECT RAISE(ABORT, 'poison result refused'); END"""
    ],
    "postgres": [
        """CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               IF NEW.result::text LIKE '%poison%' THEN
                   RAISE EXCEPTION 'poison result refused';
               END IF;
               RETURN NEW;
           END $$""",
        """CREATE TRIGGER refuse_poison BEFORE UPDATE ON jobs
           FOR EACH ROW EXECUTE FUNCTION refuse_poison()""",
    ],
}


@sql_only  # the refusal is a trigger; Redis stores any outcome a script is handed
def test_an_outcome_the_database_refuses_fails_alone(app: App, dsn: str) -> None:
    """A refusal of the data (here a trigger; in life a constraint or a size limit)
    fails that one job, and the outcomes written with it or after it still land."""
    if dsn.startswith("sqlite"):
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            for statement in REFUSE_POISON["sqlite"]:
                conn.execute(statement)
    else:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as pg:
            for statement in REFUSE_POISON["postgres"]:
                pg.execute(statement)

    @app.task(max_attempts=3)
    def echo(text: str) -> str:
        return text

    with app.worker(concurrency=4, lease=5, stop_timeout=1):
        poison = echo.enqueue("poison")
        fine = [echo.enqueue(f"fine {n}") for n in range(6)]
        assert [j.wait(timeout=5) for j in fine] == [f"fine {n}" for n in range(6)]
        wait_until(lambda: app.get(poison.id).terminal, timeout=5)
        assert echo.enqueue("later").wait(timeout=5) == "later"
    refused = app.get(poison.id)
    assert refused.state == JobState.FAILED
    assert refused.attempts == 1  # not run again: it would return the same thing
    assert "could not be recorded" in (refused.error or "")
    assert "poison result refused" in (refused.error or "")


# --- timeouts -----------------------------------------------------------------------


def test_sync_handler_past_its_timeout_is_held_until_it_returns(app: App) -> None:
    # A sync handler cannot be interrupted: the job (and its group) stays held,
    # showing that the timeout is pending, and the timeout failure is recorded
    # when the handler returns, never while it still runs.
    finish = threading.Event()
    returned = threading.Event()

    @app.task(timeout=0.2, max_attempts=1)
    def stuck() -> str:
        finish.wait(5.0)  # ignores ctx.cancelled; the test lets it go
        returned.set()
        return "too late"

    try:
        with app.worker(concurrency=2, lease=5):
            job = stuck.enqueue()
            pending = wait_until(
                lambda: (j := app.get(job.id)).progress_message and "timed out" in
                j.progress_message and j
            )  # fmt: skip
            assert pending.state == JobState.RUNNING
            time.sleep(0.3)
            assert app.get(job.id).state == JobState.RUNNING
            finish.set()
            with pytest.raises(JobFailed, match="TimeoutError") as info:
                job.wait(timeout=DEADLINE)
            assert returned.is_set()
    finally:
        finish.set()
    assert "timeout of 0.2s" in (info.value.error or "")
    (claimed,) = events_of(app, job.id, "claimed")
    (failed,) = events_of(app, job.id, "failed")
    assert seconds(failed.at, claimed.at) >= 0.5
    assert app.get(job.id).state == JobState.FAILED
    assert app.get(job.id).result is None


def test_sync_timeout_is_retried_like_a_failure(sqlite_app: App) -> None:
    app = sqlite_app
    finish = threading.Event()
    attempts: list[int] = []

    @app.task(timeout=0.2, max_attempts=2, backoff=FixedBackoff(0.05))
    def slow_once(ctx: Context) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            ctx.cancelled.wait(2.0)  # the timeout also sets the cancel signal
            finish.set()
        return ctx.attempt

    with app.worker(concurrency=2, lease=5):
        job = slow_once.enqueue()
        assert job.wait(timeout=DEADLINE) == 2
    assert finish.is_set()
    history = app.events(job.id)
    assert [e.kind for e in history] == [
        "enqueued", "claimed", "retried", "claimed", "succeeded",
    ]  # fmt: skip
    assert "TimeoutError" in (history[2].error or "")


def test_async_handler_past_its_timeout_is_cancelled(sqlite_app: App) -> None:
    app = sqlite_app
    cancelled = threading.Event()

    @app.task(timeout=0.2, max_attempts=1)
    async def stuck() -> str:
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    with app.worker(concurrency=2, lease=5):
        job = stuck.enqueue()
        with pytest.raises(JobFailed, match="TimeoutError"):
            job.wait(timeout=DEADLINE)
        wait_until(cancelled.is_set, timeout=1.0)
    (claimed,) = events_of(app, job.id, "claimed")
    (failed,) = events_of(app, job.id, "failed")
    assert 0.15 <= seconds(failed.at, claimed.at) < 1.0


# --- cancel ---------------------------------------------------------------------------


def test_cancel_reaches_a_running_sync_handler(app: App) -> None:
    started = threading.Event()
    noticed: list[float] = []

    @app.task
    def loop(ctx: Context) -> str:
        started.set()
        give_up = time.monotonic() + DEADLINE
        while not ctx.cancelled and time.monotonic() < give_up:  # a step of work at a time
            time.sleep(0.01)
        noticed.append(time.monotonic())
        return "stopped"

    with app.worker(concurrency=2, lease=30):
        job = loop.enqueue()
        assert started.wait(DEADLINE)
        asked = time.monotonic()
        app.cancel(job.id)
        wait_until(lambda: noticed, timeout=5)
        assert noticed[0] - asked < 1.0
        with pytest.raises(JobCancelled):
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert done.state == JobState.CANCELLED
    assert done.result is None  # the handler's own return value is dropped
    assert kinds(app, job.id)[-2:] == ["cancel_requested", "cancelled"]


def test_cancel_reaches_a_running_async_handler(app: App) -> None:
    started = threading.Event()
    cancelled_at: list[float] = []

    @app.task
    async def wait_forever() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise

    with app.worker(concurrency=2, lease=30):
        job = wait_forever.enqueue()
        assert started.wait(DEADLINE)
        asked = time.monotonic()
        app.cancel(job.id)
        wait_until(lambda: cancelled_at, timeout=5)
        assert cancelled_at[0] - asked < 1.0
        with pytest.raises(JobCancelled):
            job.wait(timeout=DEADLINE)
    assert app.get(job.id).state == JobState.CANCELLED


def test_cancel_while_the_claim_is_on_its_way_to_the_worker(app: App) -> None:
    """A cancel committed between the claim's commit and the job reaching the loop counts."""
    noticed = threading.Event()
    claim = app.store.job_claim

    def claim_then_cancel(*args: Any, **kwargs: Any) -> list[Any]:
        jobs = claim(*args, **kwargs)
        for job in jobs:  # committed as running, not yet handed to the worker's loop
            app.cancel(job.id)
            time.sleep(0.05)  # the notification arrives meanwhile
        return jobs

    @app.task
    def loop(ctx: Context) -> None:
        if ctx.cancelled.wait(5.0):
            noticed.set()

    with app.worker(concurrency=2, lease=30) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        time.sleep(0.1)  # idle, listening
        app.store.job_claim = claim_then_cancel  # type: ignore[method-assign]
        job = loop.enqueue()
        asked = time.monotonic()
        assert noticed.wait(5.0)
        assert time.monotonic() - asked < 1.0
        with pytest.raises(JobCancelled):
            job.wait(timeout=DEADLINE)


def test_cancel_after_success_changes_nothing(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with app.worker(concurrency=2, lease=5):
        job = add.enqueue(2, 3)
        assert job.wait(timeout=DEADLINE) == 5
    after = app.cancel(job.id)
    assert after.state == JobState.SUCCEEDED
    assert app.get(job.id).result == 5
    assert kinds(app, job.id) == ["enqueued", "claimed", "succeeded"]


# --- lost leases ------------------------------------------------------------------------


@pytest.mark.parametrize("lease", [0.6, 30.0], ids=["heartbeat-notices", "write-refused"])
def test_outcome_of_a_lost_lease_is_not_written(app: App, lease: float) -> None:
    go = threading.Event()
    started = threading.Event()
    told = threading.Event()
    reasons: list[str | None] = []

    @app.task(queue="q")
    def slow(ctx: Context, n: int) -> str:
        if n == 0:
            started.set()
            while not go.wait(0.01):
                if ctx.cancelled.is_set():
                    told.set()
            reasons.append(ctx.cancelled.reason)
            return "late"
        return f"job {n}"

    with app.worker(concurrency=1, lease=lease, maintenance=False) as worker:
        # Past the worker's first renewal round: with the long lease, the next is 10 s away.
        wait_until(
            lambda: [
                w
                for w in app.store.worker_list()
                if w.id == worker.id and w.last_seen_at > w.started_at
            ]
        )
        first = slow.enqueue(0)
        assert started.wait(DEADLINE)
        # Someone else decides the lease ran out, and another claimer takes the job over.
        future = utcnow() + timedelta(hours=1)
        assert app.store.job_rescue_expired(future) == [first.id]
        (taken,) = app.store.job_claim(["q"], 1, "other", timedelta(hours=2), future)
        assert taken.id == first.id and taken.attempts == 2
        assert taken.lease_token is not None
        if lease < 1:  # the worker's next renewal finds out, and tells the handler
            assert told.wait(2.0)
        app.store.job_finish([Finish.complete(first.id, taken.lease_token, '"winner"')], utcnow())
        go.set()
        # The worker carries on with other jobs.
        later = [slow.enqueue(n) for n in (1, 2)]
        assert [j.wait(timeout=DEADLINE) for j in later] == ["job 1", "job 2"]
    done = app.get(first.id)
    assert done.state == JobState.SUCCEEDED
    assert done.result == "winner"
    succeeded = events_of(app, first.id, "succeeded")
    assert [e.worker for e in succeeded] == ["other"]
    assert reasons == (["lease lost"] if lease < 1 else [None])


# --- wakeups ----------------------------------------------------------------------------


def test_local_enqueue_wakes_an_idle_worker(app: App) -> None:
    @app.task
    def quick() -> None:
        return None

    with app.worker(concurrency=2, lease=5, poll_interval=10) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        first = quick.enqueue()
        first.wait(timeout=DEADLINE)
        time.sleep(0.1)  # idle: the next poll is ~10 s away
        for _ in range(3):
            job = quick.enqueue()
            job.wait(timeout=DEADLINE)
            (enqueued,) = events_of(app, job.id, "enqueued")
            (claimed,) = events_of(app, job.id, "claimed")
            assert seconds(claimed.at, enqueued.at) < 0.05


def test_local_enqueue_wakes_a_worker_without_any_database_feed(app: App) -> None:
    """The in-process wake alone: the store's change feed is switched off."""
    app.store.subscribe = lambda on_change: _NoFeed()  # type: ignore[method-assign]

    @app.task
    def quick() -> None:
        return None

    with app.worker(concurrency=2, lease=5, poll_interval=10) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        time.sleep(0.1)
        job = quick.enqueue()
        assert job.wait(timeout=2) is None
    (enqueued,) = events_of(app, job.id, "enqueued")
    (claimed,) = events_of(app, job.id, "claimed")
    assert seconds(claimed.at, enqueued.at) < 0.05


def test_deferred_job_starts_on_time(app: App) -> None:
    @app.task
    def later() -> None:
        return None

    with app.worker(concurrency=2, lease=5, poll_interval=10) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        job = later.options(delay=0.3).enqueue()
        job.wait(timeout=DEADLINE)
    (claimed,) = events_of(app, job.id, "claimed")
    late = seconds(claimed.at, job.run_at)
    assert 0 <= late < 0.1


def test_deferred_job_enqueued_while_another_is_deferred_further(sqlite_app: App) -> None:
    """A nearer run_at than the worker's current timer moves the timer forward."""
    app = sqlite_app

    @app.task
    def later() -> None:
        return None

    with app.worker(concurrency=2, lease=5, poll_interval=10) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        far = later.options(delay=60).enqueue()
        time.sleep(0.05)
        near = later.options(delay=0.3).enqueue()
        near.wait(timeout=DEADLINE)
        assert app.get(far.id).state == JobState.QUEUED
    (claimed,) = events_of(app, near.id, "claimed")
    assert 0 <= seconds(claimed.at, near.run_at) < 0.1


def test_retry_with_backoff_starts_on_time(app: App) -> None:
    @app.task(max_attempts=2, backoff=FixedBackoff(0.3))
    def once_more(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return ctx.attempt

    with app.worker(concurrency=2, lease=5, poll_interval=10):
        job = once_more.enqueue()
        assert job.wait(timeout=DEADLINE) == 2
    done = app.get(job.id)
    (retried,) = events_of(app, job.id, "retried")
    first_claim, second_claim = events_of(app, job.id, "claimed")
    # run_at is the retry time the worker chose: the failure's time plus the backoff,
    # and the failure came after the first claim and before it was recorded.
    assert seconds(done.run_at, first_claim.at) >= 0.3
    assert seconds(done.run_at, retried.at) <= 0.3
    assert 0 <= seconds(second_claim.at, done.run_at) < 0.1


def test_retry_snooze_starts_on_time(sqlite_app: App) -> None:
    app = sqlite_app
    calls: list[int] = []

    @app.task
    def snooze_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise Retry(0.3)
        return "woke"

    with app.worker(concurrency=2, lease=5, poll_interval=10):
        job = snooze_once.enqueue()
        assert job.wait(timeout=DEADLINE) == "woke"
    done = app.get(job.id)
    second_claim = events_of(app, job.id, "claimed")[1]
    assert 0 <= seconds(second_claim.at, done.run_at) < 0.1


_ENQUEUE_ELSEWHERE = """
import sys
from conveyor import App
with App(sys.argv[1]) as app:
    job = app.enqueue("remote", [sys.argv[2]], queue="remote")
    print(job.id)
"""


def test_enqueue_from_another_process_wakes_an_idle_worker(app: App, dsn: str) -> None:
    @app.task(queue="remote")
    def remote(text: str) -> str:
        return text.upper()

    with app.worker(concurrency=2, lease=5, poll_interval=10) as worker:
        wait_until(lambda: any(w.id == worker.id for w in app.store.worker_list()))
        for word in ("one", "two"):
            time.sleep(0.1)  # idle
            out = subprocess.run(
                [sys.executable, "-c", _ENQUEUE_ELSEWHERE, dsn, word],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            job_id = int(out.stdout)
            assert app.wait(job_id, timeout=DEADLINE) == word.upper()
            (enqueued,) = events_of(app, job_id, "enqueued")
            (claimed,) = events_of(app, job_id, "claimed")
            assert seconds(claimed.at, enqueued.at) < 0.2


# --- waiting for results -----------------------------------------------------------------


def test_wait_returns_promptly_after_a_worker_completes(app: App) -> None:
    proceed = threading.Event()

    @app.task
    def gated() -> str:
        proceed.wait(DEADLINE)
        return "done"

    with app.worker(concurrency=2, lease=5):
        job = gated.enqueue()
        wait_until(lambda: app.get(job.id).state == JobState.RUNNING)
        timer = threading.Timer(0.1, proceed.set)
        timer.start()
        assert job.wait(timeout=DEADLINE) == "done"
        returned = utcnow()
        timer.join()
    (succeeded,) = events_of(app, job.id, "succeeded")
    assert 0 <= seconds(returned, succeeded.at) < 0.1


def test_wait_on_a_finished_job_returns_at_once(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    job = add.enqueue(1, 1)
    app.run_worker(burst=True, concurrency=1, lease=5)
    started = time.monotonic()
    assert job.wait(timeout=DEADLINE) == 2
    assert time.monotonic() - started < 0.05


def test_wait_listens_before_it_reads(sqlite_app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion between wait's read and its sleep is not missed (no fallback-poll delay)."""
    app = sqlite_app
    job = app.enqueue("t")
    (claimed,) = app.store.job_claim(["default"], 1, "w", timedelta(seconds=30), utcnow())
    assert claimed.lease_token is not None
    read = app.get

    def read_then_finish(job_id: int) -> Any:
        seen = read(job_id)
        if seen.state == JobState.RUNNING:
            # The job ends just after wait read it as running, as a worker would end it.
            app.store.job_finish([Finish.complete(job_id, claimed.lease_token, "7")], utcnow())
            app.changes.publish("done", str(job_id))
        return seen

    monkeypatch.setattr(app, "get", read_then_finish)
    started = time.monotonic()
    assert job.wait(timeout=DEADLINE) == 7
    assert time.monotonic() - started < 0.1


# --- stopping ------------------------------------------------------------------------------


def test_stop_lets_a_running_job_finish(app: App) -> None:
    started = threading.Event()

    @app.task
    def slow() -> str:
        started.set()
        time.sleep(0.5)
        return "finished"

    worker = app.worker(concurrency=2, lease=5, stop_timeout=10).start()
    job = slow.enqueue()
    assert started.wait(DEADLINE)
    worker.stop()
    assert worker.wait_stopped(0)
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED
    assert done.result == "finished"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_stop_timeout_releases_running_jobs(app: App, kind: str) -> None:
    started = threading.Event()
    runs: list[int] = []

    if kind == "sync":

        @app.task
        def slow(ctx: Context) -> str:
            runs.append(ctx.attempt)
            if len(runs) == 1:
                started.set()
                ctx.cancelled.wait(DEADLINE)  # the drain sets the cancel signal
                return "dropped"
            return "second run"

    else:

        @app.task(name="slow")
        async def aslow(ctx: Context) -> str:
            runs.append(ctx.attempt)
            if len(runs) == 1:
                started.set()
                await asyncio.sleep(DEADLINE)
                return "dropped"
            return "second run"

    worker = app.worker(concurrency=2, lease=30, stop_timeout=0).start()
    job = app.enqueue("slow")
    assert started.wait(DEADLINE)
    stopping = time.monotonic()
    worker.stop()
    assert time.monotonic() - stopping < 2.0
    released = app.get(job.id)
    assert released.state == JobState.QUEUED
    assert released.attempts == 0
    assert released.lease_token is None
    assert kinds(app, job.id) == ["enqueued", "claimed", "released"]
    # Another worker runs it at once (no waiting for the old lease to run out).
    app.run_worker(burst=True, concurrency=1, lease=5)
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED
    assert done.result == "second run"
    assert done.attempts == 1
    assert runs == [1, 1]


def test_hard_stop_releases_at_once(sqlite_app: App) -> None:
    app = sqlite_app
    started = threading.Event()
    finish = threading.Event()

    @app.task
    def stubborn() -> str:
        started.set()
        finish.wait(DEADLINE)  # ignores the cancel signal
        return "late"

    try:
        worker = app.worker(concurrency=2, lease=30, stop_timeout=30).start()
        job = stubborn.enqueue()
        assert started.wait(DEADLINE)
        stopping = time.monotonic()
        worker.stop(graceful=False)
        assert time.monotonic() - stopping < 2.0
        assert app.get(job.id).state == JobState.QUEUED
        assert app.get(job.id).attempts == 0
    finally:
        finish.set()


# --- burst and concurrency ---------------------------------------------------------------


def test_burst_returns_when_idle_and_respects_concurrency(app: App) -> None:
    lock = threading.Lock()
    running = 0
    most = 0

    def enter() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)

    def leave() -> None:
        nonlocal running
        with lock:
            running -= 1

    @app.task
    def work(n: int) -> int:
        enter()
        try:
            time.sleep(0.05)
        finally:
            leave()
        return n

    @app.task
    async def awork(n: int) -> int:
        enter()
        try:
            await asyncio.sleep(0.05)
        finally:
            leave()
        return n

    jobs = work.enqueue_many([([n], {}) for n in range(10)])
    jobs += awork.enqueue_many([([n], {}) for n in range(10, 20)])
    later = work.options(delay=60).enqueue(99)
    started = time.monotonic()
    assert app.run_worker(burst=True, concurrency=3, lease=5) == 0
    assert time.monotonic() - started < 5
    assert most == 3
    assert running == 0
    assert [app.get(j.id).result for j in jobs] == list(range(20))
    assert app.get(later.id).state == JobState.QUEUED  # not ready: burst does not wait for it


def test_burst_on_an_empty_queue_returns_at_once(sqlite_app: App) -> None:
    app = sqlite_app

    @app.task
    def work() -> None:
        return None

    started = time.monotonic()
    assert app.run_worker(burst=True, concurrency=2, lease=5) == 0
    assert time.monotonic() - started < 2


def test_worker_needs_queues_and_sane_options(sqlite_app: App) -> None:
    app = sqlite_app
    with pytest.raises(ValueError, match="no queues"):
        app.worker()

    @app.task
    def work() -> None:
        return None

    with pytest.raises(ValueError, match="concurrency"):
        app.worker(concurrency=0)
    with pytest.raises(ValueError, match="lease"):
        app.worker(lease=0.1)


# --- the workers table --------------------------------------------------------------------


def test_running_worker_is_listed_until_it_stops(app: App) -> None:
    @app.task(queue="a")
    def work() -> None:
        return None

    with app.worker(queues=["a", "b"], concurrency=4, lease=5) as worker:
        (info,) = wait_until(lambda: app.store.worker_list())
        assert info.id == worker.id
        assert info.host == socket.gethostname()
        assert info.pid == os.getpid()
        assert info.queues == ["a", "b"]
        assert info.concurrency == 4
        assert info.last_seen_at >= info.started_at
    assert app.store.worker_list() == []


# --- maintenance ----------------------------------------------------------------------------


def test_leader_lease_is_held_by_one_at_a_time(app: App) -> None:
    one = Maintenance(app.runtime, "one", lease=0.4)
    two = Maintenance(app.runtime, "two", lease=0.4)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    one.run_once(now)
    two.run_once(now)
    assert (one.is_leader, two.is_leader) == (True, False)
    one.run_once(now + one.ttl / 2)  # renewed
    two.run_once(now + one.ttl)
    assert (one.is_leader, two.is_leader) == (True, False)
    # The leader froze: once its lease has run out, another takes over.
    two.run_once(now + one.ttl * 3)
    one.run_once(now + one.ttl * 3)
    assert (one.is_leader, two.is_leader) == (False, True)


def test_two_workers_elect_one_maintenance_leader(app: App) -> None:
    @app.task
    def work() -> None:
        return None

    with app.worker(lease=0.4) as first, app.worker(lease=0.4) as second:
        wait_until(lambda: first._maintenance and second._maintenance)
        leaders = [first._maintenance, second._maintenance]
        wait_until(lambda: any(m.is_leader for m in leaders))
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            assert sum(m.is_leader for m in leaders) <= 1
            time.sleep(0.01)
        leader, other = (first, second) if leaders[0].is_leader else (second, first)
        leader.stop()  # a leader that stops hands the lease over
        wait_until(lambda: other._maintenance.is_leader, timeout=2)


def test_leader_rescues_an_expired_lease_and_the_job_runs(app: App) -> None:
    @app.task(queue="q", max_attempts=3)
    def work(n: int) -> int:
        return n * 2

    job = work.enqueue(21)
    # A claimer that dies at once: it never renews its short lease.
    (ghost,) = app.store.job_claim(["q"], 1, "ghost", timedelta(seconds=0.2), utcnow())
    assert ghost.id == job.id
    with app.worker(concurrency=2, lease=0.4, poll_interval=10):
        assert job.wait(timeout=DEADLINE) == 42
    history = app.events(job.id)
    assert [e.kind for e in history] == ["enqueued", "claimed", "rescued", "claimed", "succeeded"]
    assert history[1].worker == "ghost"
    assert history[2].error == "worker lost: lease expired"
    assert history[3].worker not in (None, "ghost")
    assert app.get(job.id).attempts == 2


# --- the command line ----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
CONVEYOR = str(Path(sys.executable).parent / "conveyor")


def _conveyor(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONVEYOR_DSN": dsn}
    return subprocess.run(
        [CONVEYOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_worker_in_burst_mode_runs_the_jobs_and_exits(app: App, dsn: str) -> None:
    jobs = [app.enqueue("double", [n], queue="cli") for n in range(5)]
    done = _conveyor(dsn, "worker", "tests.worker_app:app", "--burst", "--concurrency", "2")
    assert done.returncode == 0, done.stderr
    assert [app.get(j.id).result for j in jobs] == [0, 2, 4, 6, 8]
    assert app.store.worker_list() == []


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.no_such_module:app", "cannot import 'tests.no_such_module'"),
        ("tests.worker_app", "expected module:attribute"),
        ("tests.worker_app:missing", "module 'tests.worker_app' has no 'missing'"),
        ("tests.worker_app:not_an_app", "is not a conveyor App (got str)"),
    ],
)
def test_cli_worker_with_a_bad_target_says_what_is_wrong(
    tmp_path: Path, target: str, message: str
) -> None:
    done = _conveyor(f"sqlite:///{tmp_path / 'jobs.db'}", "worker", target, "--burst")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, done.stderr
    assert message in errors[0]


def test_cli_worker_stops_cleanly_on_sigterm(app: App, dsn: str) -> None:
    env = {**os.environ, "CONVEYOR_DSN": dsn}
    command = [CONVEYOR, "worker", "tests.worker_app:app", "--lease", "5", "--poll-interval", "5"]
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            (info,) = wait_until(lambda: app.store.worker_list(), timeout=30)
            assert info.pid == process.pid
            assert info.queues == ["cli"]
            job = app.enqueue("double", [21], queue="cli")
            assert job.wait(timeout=DEADLINE) == 42
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=DEADLINE)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, stderr
    assert "SIGTERM: draining" in stderr
    assert app.store.worker_list() == []
