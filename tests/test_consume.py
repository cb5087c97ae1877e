"""The pull API on both backends: ``app.consume`` and ``app.aconsume``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor import App, FixedBackoff, JobState, LeaseLostError
from conveyor.job import utcnow
from conveyor.store.postgres import listener as pg_listener
from conveyor.worker.consume import ConsumedJob

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing an App waits for its LISTEN thread, which looks for a stop every ``_WAIT`` s."""
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:
        application.migrate()
        yield application


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


def at(app: App, job_id: int, kind: str) -> datetime:
    (event,) = [e for e in app.events(job_id) if e.kind == kind]
    return event.at


def test_consume_yields_a_groups_jobs_in_order(app: App) -> None:
    steps = [app.enqueue("step", [n], queue="chat", group="g") for n in range(4)]
    elsewhere = app.enqueue("step", ["h"], queue="chat", group="h")
    loose = app.enqueue("step", ["none"], queue="chat")
    seen = []
    for job in app.consume(["chat"], group="g", lease=5):
        assert isinstance(job, ConsumedJob)
        with job:
            seen.append((job.id, job.args[0], job.attempts, job.group))
        if len(seen) == len(steps):
            break
    assert seen == [(j.id, n, 1, "g") for n, j in enumerate(steps)]
    for job in steps:
        done = app.get(job.id)
        assert done.state == JobState.SUCCEEDED
        assert done.result is None
    # Only the group asked for was touched.
    assert app.get(elsewhere.id).state == JobState.QUEUED
    assert app.get(loose.id).state == JobState.QUEUED


def test_a_group_runs_one_job_at_a_time(app: App) -> None:
    first = app.enqueue("step", [1], queue="chat", group="g")
    second = app.enqueue("step", [2], queue="chat", group="g")
    other = app.enqueue("step", [3], queue="chat", group="h")
    one = app.consume(["chat"], lease=5)
    two = app.consume(["chat"], lease=5)
    try:
        held = next(one)
        assert held.id == first.id
        # While g's first job is held, g's second one is not ready: the other group's is.
        assert next(two).id == other.id
    finally:
        one.close()
        two.close()
    # Closing the iterators released both jobs; g still goes in order.
    assert app.get(first.id).state == JobState.QUEUED
    assert app.get(other.id).state == JobState.QUEUED
    ids = []
    for job in app.consume(["chat"], group="g", lease=5):
        job.complete()
        ids.append(job.id)
        if len(ids) == 2:
            break
    assert ids == [first.id, second.id]


def test_with_completes_on_exit_and_fails_on_an_exception(app: App) -> None:
    good = app.enqueue("step", [1], queue="q")
    bad = app.enqueue("step", [2], queue="q", max_attempts=1)
    with pytest.raises(ValueError, match="bad input 2"):
        for job in app.consume(["q"], lease=5):
            with job:
                if job.args[0] == 2:
                    raise ValueError(f"bad input {job.args[0]}")
    assert app.get(good.id).state == JobState.SUCCEEDED
    failed = app.get(bad.id)
    assert failed.state == JobState.FAILED
    assert failed.error == "ValueError: bad input 2"
    assert kinds(app, bad.id) == ["enqueued", "claimed", "failed"]


def test_complete_fail_and_release(app: App) -> None:
    job = app.enqueue("step", ["x"], queue="q", max_attempts=3)
    jobs = app.consume(["q"], lease=5)
    try:
        first = next(jobs)
        assert (first.id, first.attempts) == (job.id, 1)
        first.release()  # gives the attempt back
        assert app.get(job.id).attempts == 0
        second = next(jobs)
        assert (second.id, second.attempts) == (job.id, 1)
        second.fail("not yet", retry_in=0)
        assert app.get(job.id).error == "not yet"
        third = next(jobs)
        assert (third.id, third.attempts) == (job.id, 2)
        third.complete({"done": True})
    finally:
        jobs.close()
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED
    assert done.result == {"done": True}
    assert done.attempts == 2
    assert kinds(app, job.id) == [
        "enqueued", "claimed", "released", "claimed", "retried", "claimed", "succeeded",
    ]  # fmt: skip


def test_fail_uses_the_tasks_backoff(sqlite_app: App) -> None:
    app = sqlite_app

    @app.task(queue="q", backoff=FixedBackoff(60))
    def step(n: int) -> None: ...

    job = step.enqueue(1)
    jobs = app.consume(["q"], lease=5)
    try:
        held = next(jobs)
        held.fail(RuntimeError("later"))
    finally:
        jobs.close()
    retried = app.get(job.id)
    assert retried.state == JobState.QUEUED
    assert retried.error == "RuntimeError: later"
    assert 59 <= (retried.run_at - utcnow()).total_seconds() <= 60


def test_breaking_out_of_the_loop_releases_the_held_job(app: App) -> None:
    job = app.enqueue("step", [1], queue="q")
    for held in app.consume(["q"], lease=5):
        assert held.id == job.id
        break
    assert held.ended
    released = app.get(job.id)
    assert released.state == JobState.QUEUED
    assert released.attempts == 0
    assert kinds(app, job.id) == ["enqueued", "claimed", "released"]


def test_a_job_the_loop_body_did_not_end_is_handed_back(sqlite_app: App) -> None:
    app = sqlite_app
    job = app.enqueue("step", [1], queue="q")
    seen = []
    for held in app.consume(["q"], lease=5):
        seen.append(held.attempts)
        if len(seen) == 2:
            held.complete("second time")
            break
        # The first time round the body moves on without ending the job.
    assert seen == [1, 1]
    assert app.get(job.id).result == "second time"
    assert kinds(app, job.id) == ["enqueued", "claimed", "released", "claimed", "succeeded"]


def test_the_lease_is_renewed_while_a_job_is_held(app: App) -> None:
    job = app.enqueue("step", [1], queue="q")
    jobs = app.consume(["q"], lease=0.5)
    try:
        held = next(jobs)
        first_expiry = app.get(job.id).lease_expires_at
        assert first_expiry is not None
        held_until = time.monotonic() + 1.2  # more than twice the lease
        while time.monotonic() < held_until:
            # What the rescuer would do: nothing, the lease holds.
            assert app.store.job_rescue_expired(utcnow()) == []
            time.sleep(0.05)
        renewed = app.get(job.id).lease_expires_at
        assert renewed is not None and renewed > first_expiry
        held.complete("kept")
    finally:
        jobs.close()
    assert app.get(job.id).result == "kept"
    assert "rescued" not in kinds(app, job.id)


def test_ending_a_job_whose_lease_was_lost_raises(app: App) -> None:
    first = app.enqueue("step", [1], queue="q")
    second = app.enqueue("step", [2], queue="q")
    third = app.enqueue("step", [3], queue="q")
    jobs = app.consume(["q"], lease=30)
    try:
        for job, end in (
            (first, lambda held: held.complete("late")),
            (second, lambda held: held.fail("late")),
            (third, lambda held: held.release()),
        ):
            held = next(jobs)
            assert held.id == job.id
            # The job's lease is declared expired and it goes back to the queue (for later).
            future = utcnow() + timedelta(hours=1)
            assert app.store.job_rescue_expired(future) == [job.id]
            with pytest.raises(LeaseLostError, match=f"job {job.id}: the lease was lost"):
                end(held)
            assert held.ended
    finally:
        jobs.close()
    for job in (first, second, third):
        rescued = app.get(job.id)
        assert rescued.state == JobState.QUEUED
        assert rescued.result is None
        assert rescued.error == "worker lost: lease expired"
        assert kinds(app, job.id) == ["enqueued", "claimed", "rescued"]


def test_with_raises_when_the_lease_was_lost(sqlite_app: App) -> None:
    app = sqlite_app
    job = app.enqueue("step", [1], queue="q")
    with pytest.raises(LeaseLostError):
        for held in app.consume(["q"], lease=30):
            with held:
                app.store.job_rescue_expired(utcnow() + timedelta(hours=1))
    assert app.get(job.id).state == JobState.QUEUED


def test_consume_wakes_at_once_for_a_new_job(app: App) -> None:
    jobs = app.consume(["q"], lease=5, poll_interval=10)
    timer = threading.Timer(0.2, lambda: app.enqueue("step", [1], queue="q"))
    try:
        timer.start()
        held = next(jobs)
        held.complete()
    finally:
        jobs.close()
        timer.join()
    assert (at(app, held.id, "claimed") - at(app, held.id, "enqueued")).total_seconds() < 0.05


def test_consume_waits_for_a_deferred_job(app: App) -> None:
    job = app.enqueue("step", [1], queue="q", delay=0.3)
    jobs = app.consume(["q"], lease=5, poll_interval=10)
    try:
        held = next(jobs)
        held.complete()
    finally:
        jobs.close()
    assert held.id == job.id
    assert 0 <= (at(app, job.id, "claimed") - job.run_at).total_seconds() < 0.1


async def _consume_async(app: App, expected: int) -> list[tuple[int, int]]:
    results: list[tuple[int, int]] = []
    async with contextlib.aclosing(app.aconsume(["q"], lease=5, poll_interval=10)) as jobs:
        async for job in jobs:
            results.append((job.id, job.args[0]))
            job.complete(job.args[0] * 2)
            if len(results) == 1:
                # The next job arrives while the loop waits: it is woken, not polled.
                asyncio.get_running_loop().call_later(
                    0.1, lambda: app.enqueue("step", [20], queue="q")
                )
            if len(results) == expected:
                break
    return results


def test_aconsume(app: App) -> None:
    first = app.enqueue("step", [10], queue="q")
    started = time.monotonic()
    results = asyncio.run(_consume_async(app, expected=2))
    assert time.monotonic() - started < 5
    assert results[0] == (first.id, 10)
    assert results[1][1] == 20
    assert [app.get(job_id).result for job_id, _ in results] == [20, 40]


async def _break_out_async(app: App) -> int:
    async with contextlib.aclosing(app.aconsume(["q"], lease=5)) as jobs:
        async for job in jobs:
            return job.id
    raise AssertionError("no job")


def test_leaving_aconsume_releases_the_held_job(app: App) -> None:
    job = app.enqueue("step", [1], queue="q")
    assert asyncio.run(_break_out_async(app)) == job.id
    released = app.get(job.id)
    assert released.state == JobState.QUEUED
    assert released.attempts == 0


async def _give_up_waiting(app: App) -> None:
    jobs = app.aconsume(["q"], lease=5, poll_interval=10)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(jobs), timeout=0.1)
    await jobs.aclose()


def test_aconsume_cancelled_while_waiting_stops_its_thread(sqlite_app: App) -> None:
    app = sqlite_app
    started = time.monotonic()
    # asyncio.run waits for the threads of its default executor: a step that went on
    # waiting for a job would hold it up.
    asyncio.run(_give_up_waiting(app))
    assert time.monotonic() - started < 2
    job = app.enqueue("step", [1], queue="q")
    time.sleep(0.1)
    assert kinds(app, job.id) == ["enqueued"]  # nobody is left to take it


async def _cancel_while_claiming(app: App, claimed: threading.Event, go: threading.Event) -> None:
    jobs = app.aconsume(["q"], lease=5)
    step = asyncio.ensure_future(anext(jobs))
    assert await asyncio.to_thread(claimed.wait, DEADLINE)
    step.cancel()  # the claim went through, but nobody will see the job
    threading.Timer(0.05, go.set).start()
    with pytest.raises(asyncio.CancelledError):
        await step
    await jobs.aclose()


def test_a_job_claimed_by_a_cancelled_aconsume_is_released(sqlite_app: App) -> None:
    app = sqlite_app
    job = app.enqueue("step", [1], queue="q")
    claimed, go = threading.Event(), threading.Event()
    claim = app.store.job_claim

    def slow_claim(*args: Any, **kwargs: Any) -> list[Any]:
        jobs = claim(*args, **kwargs)
        if jobs:
            claimed.set()
            go.wait(DEADLINE)
        return jobs

    app.store.job_claim = slow_claim  # type: ignore[method-assign]
    asyncio.run(_cancel_while_claiming(app, claimed, go))
    released = app.get(job.id)
    assert released.state == JobState.QUEUED
    assert released.attempts == 0
    assert kinds(app, job.id) == ["enqueued", "claimed", "released"]
