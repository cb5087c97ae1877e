"""ctx.sleep: a handler ends its attempt until a wake time recorded as a durable step,
holding no slot or lease meanwhile, and goes on from there on every store."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from conveyor import App, Context, JobState, Sleeping
from conveyor.job import utcnow
from conveyor.testing import drain


def sleeper(app: App, calls: list[str], seconds: float = 0.4) -> None:
    @app.task(queue="naps")
    def remind(ctx: Context, user: str) -> str:
        ctx.step("ask", lambda: calls.append("ask"))
        ctx.sleep(seconds)
        ctx.step("remind", lambda: calls.append("remind"))
        return f"reminded {user}"


def test_a_sleeping_job_holds_nothing_and_goes_on_after_its_sleep(app: App) -> None:
    calls: list[str] = []
    sleeper(app, calls)
    job = app.get_task("remind").enqueue("ann")
    with app.worker(queues=["naps"], concurrency=2, poll_interval=0.1):
        deadline = time.monotonic() + 10
        while app.get(job.id).state != JobState.QUEUED or not calls:
            assert time.monotonic() < deadline, app.get(job.id)
            time.sleep(0.02)
        parked = app.get(job.id)
        assert calls == ["ask"] and parked.attempts == 0  # the attempt was given back
        assert parked.state == JobState.QUEUED and parked.lease_token is None
        (step,) = [s for s in app.steps(job.id) if s.name == "sleep-1"]
        until = dt.datetime.fromisoformat(step.result["until"])
        assert abs((parked.run_at - until).total_seconds()) < 0.01
        assert app.wait(job.id, timeout=10) == "reminded ann"
    assert calls == ["ask", "remind"]  # the recorded step did not run again
    assert app.get(job.id).attempts == 1
    assert app.get(job.id).started_at >= until  # resumed at its wake time, not before


def test_a_job_woken_before_its_time_sleeps_on(app: App) -> None:
    """As after a crash between recording the sleep and queueing the job for it: the
    replay finds the recorded wake time ahead of it and sleeps again, never cut short."""
    calls: list[str] = []
    sleeper(app, calls, seconds=3600)
    job = app.get_task("remind").enqueue("bo")
    assert drain(app, ["naps"]) == {"snoozed": 1}
    until = app.get(job.id).run_at
    assert app.run_jobs_now([job.id]) == 1
    assert app.get(job.id).run_at < until
    assert drain(app, ["naps"]) == {"snoozed": 1}
    again = app.get(job.id)
    assert abs((again.run_at - until).total_seconds()) < 1 and calls == ["ask"]
    assert [s.name for s in app.steps(job.id)].count("sleep-1") == 1


def test_drain_with_scheduled_runs_a_sleeper_to_its_end(app: App) -> None:
    calls: list[str] = []
    sleeper(app, calls, seconds=3600)
    job = app.get_task("remind").enqueue("cy")
    assert drain(app, ["naps"], with_scheduled=True) == {"snoozed": 1, "succeeded": 1}
    assert app.get(job.id).result == "reminded cy" and calls == ["ask", "remind"]


def test_sleep_until_a_moment_names_and_async(app: App) -> None:
    seen: list[Any] = []

    @app.task(queue="naps")
    async def nap(ctx: Context) -> None:
        await ctx.asleep(utcnow() + dt.timedelta(hours=1), name="until-noon")
        seen.append("woke")

    job = nap.enqueue()
    assert drain(app, ["naps"]) == {"snoozed": 1}
    assert [s.name for s in app.steps(job.id)] == ["until-noon"]
    assert drain(app, ["naps"], with_scheduled=True) == {"succeeded": 1}
    assert seen == ["woke"]


@pytest.mark.parametrize(
    ("duration", "message"),
    [
        (-1, "is not from 0 to"),
        ("soon", "give seconds, a timedelta or a datetime"),
        (dt.datetime(2030, 1, 1), "give an aware datetime"),
        (float("nan"), "is not from 0 to"),
    ],
)
def test_a_bad_sleep_fails_the_job_with_what_was_wrong(
    app: App, duration: Any, message: str
) -> None:
    @app.task(queue="naps")
    def nap(ctx: Context) -> None:
        ctx.sleep(duration)

    job = nap.enqueue()
    assert drain(app, ["naps"]) == {"failed": 1}
    failed = app.get(job.id)
    assert message in (failed.error or "") and failed.attempts == 1


def test_sleeping_is_a_retry_that_says_until_when() -> None:
    until = utcnow()
    exc = Sleeping(until, 5.0)
    assert exc.delay == 5.0 and exc.until == until and until.isoformat() in str(exc)
