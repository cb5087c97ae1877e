"""Signals: app.signal delivers a payload to a job, ctx.wait_for takes it (or parks the
job until it comes, or times out), each signal taken once, on every store."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from conveyor import (
    App,
    Context,
    InvalidJobError,
    JobNotFoundError,
    JobState,
    JobStateError,
    SignalTimeout,
)
from conveyor.signals import signals, waiting
from conveyor.testing import drain


def approver(app: App, calls: list[Any], timeout: float = 3600) -> None:
    @app.task(queue="sig")
    def approve(ctx: Context, order: str) -> Any:
        ctx.step("ask", lambda: calls.append("ask"))
        try:
            answer = ctx.wait_for("approval", timeout=timeout)
        except SignalTimeout:
            calls.append("timed out")
            return "no answer"
        calls.append(answer)
        return {"order": order, "answer": answer}


def test_a_signal_sent_before_the_wait_is_kept_and_taken_at_once(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls)
    job = app.get_task("approve").enqueue("o-1")
    assert app.signal(job.id, "approval", {"ok": True}) is False  # kept, nothing to wake
    assert drain(app, ["sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == {"order": "o-1", "answer": {"ok": True}}
    (sent,) = signals(app.store, job.id)
    assert sent.received_at is not None and sent.step == "signal-approval-1"
    assert [s.name for s in app.steps(job.id)] == ["ask", "signal-approval-1"]


def test_a_waiting_job_is_parked_and_woken_by_its_signal(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls)
    job = app.get_task("approve").enqueue("o-2")
    assert drain(app, ["sig"]) == {"snoozed": 1}
    parked = app.get(job.id)
    assert parked.state == JobState.QUEUED and parked.attempts == 0
    assert parked.run_at > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    wait = waiting(app.store, job.id)
    assert wait is not None and wait.signal == "approval" and wait.step == "signal-approval-1"
    assert parked.waiting() == wait  # as app.get gives the job
    assert abs((wait.until - parked.run_at).total_seconds()) < 0.01
    assert app.signal(job.id, "other", 1) is False  # not what it waits for: stays parked
    assert app.get(job.id).run_at == parked.run_at
    assert app.signal(job.id, "approval", "yes") is True  # due now, in the same write
    assert app.get(job.id).run_at <= dt.datetime.now(dt.UTC)
    assert drain(app, ["sig"]) == {"succeeded": 1}
    assert calls == ["ask", "yes"]  # the recorded step did not run again
    assert waiting(app.store, job.id) is None
    assert [s.step for s in signals(app.store, job.id)] == [None, "signal-approval-1"]


def test_a_worker_resumes_a_parked_job_when_the_signal_comes(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls)
    job = app.get_task("approve").enqueue("o-3")
    with app.worker(queues=["sig"], concurrency=2, poll_interval=0.1):
        deadline = time.monotonic() + 10
        while waiting(app.store, job.id) is None or app.get(job.id).state != JobState.QUEUED:
            assert time.monotonic() < deadline, app.get(job.id)
            time.sleep(0.02)
        app.signal(job.id, "approval", [1, 2])
        assert app.wait(job.id, timeout=10) == {"order": "o-3", "answer": [1, 2]}
    assert calls == ["ask", [1, 2]]


def test_the_timeout_raises_signal_timeout_once_its_time_is_over(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls, timeout=0.3)
    job = app.get_task("approve").enqueue("o-4")
    assert drain(app, ["sig"]) == {"snoozed": 1}
    first = waiting(app.store, job.id)
    assert first is not None
    time.sleep(0.4)
    assert drain(app, ["sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == "no answer" and calls == ["ask", "timed out"]
    (step,) = [s for s in app.steps(job.id) if s.name == "signal-approval-1"]
    assert "timeout" in step.result
    # A signal after the timeout is kept for a later wait of a live job; this one ended.
    with pytest.raises(JobStateError, match=r"has finished \(succeeded\)"):
        app.signal(job.id, "approval", "late")


def test_a_replay_keeps_the_first_deadline(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls, timeout=3600)
    job = app.get_task("approve").enqueue("o-5")
    assert drain(app, ["sig"]) == {"snoozed": 1}
    first = waiting(app.store, job.id)
    assert app.run_jobs_now([job.id]) == 1  # woken early by an operator: waits on
    assert drain(app, ["sig"]) == {"snoozed": 1}
    again = waiting(app.store, job.id)
    assert first is not None and again is not None and again.until == first.until
    assert abs((app.get(job.id).run_at - first.until).total_seconds()) < 0.01
    assert calls == ["ask"]


def test_each_signal_is_taken_once_in_order(app: App) -> None:
    @app.task(queue="sig", max_attempts=1)
    def collect(ctx: Context) -> list[Any]:
        return [ctx.wait_for("item"), ctx.wait_for("item"), ctx.wait_for("item", 0)]

    job = collect.enqueue()
    app.signal(job.id, "item", "a")
    app.signal(job.id, "item", "b")
    assert drain(app, ["sig"]) == {"failed": 1}  # the third timed out at once: not caught
    failed = app.get(job.id)
    assert "SignalTimeout" in (failed.error or "") and "no signal 'item'" in (failed.error or "")
    taken = signals(app.store, job.id)
    assert [(s.payload, s.step) for s in taken] == [("a", "signal-item-1"), ("b", "signal-item-2")]


def test_signals_to_unknown_or_finished_jobs_and_bad_names_are_refused(app: App) -> None:
    @app.task(queue="sig")
    def quick() -> int:
        return 1

    with pytest.raises(JobNotFoundError, match="no job with id 999999"):
        app.signal(999999, "go")
    job = quick.enqueue()
    assert drain(app, ["sig"]) == {"succeeded": 1}
    with pytest.raises(JobStateError, match=f"job {job.id} has finished"):
        app.signal(job.id, "go")
    with pytest.raises(InvalidJobError, match="signal name"):
        app.signal(job.id, "")
    with pytest.raises(InvalidJobError):
        app.signal(job.id, "go", {1, 2})  # not JSON
    assert signals(app.store, job.id) == []


def test_a_signal_name_is_data_not_syntax(app: App) -> None:
    name = 'it\'s "x" -- ; DROP TABLE jobs; {} *:?'

    @app.task(queue="sig")
    def odd(ctx: Context) -> Any:
        return ctx.wait_for(name, step="odd")

    job = odd.enqueue()
    assert drain(app, ["sig"]) == {"snoozed": 1}
    assert app.signal(job.id, name, {"k": "v'\""}) is True
    assert drain(app, ["sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == {"k": "v'\""}


def test_async_handlers_await_their_signal(app: App) -> None:
    @app.task(queue="sig")
    async def listen(ctx: Context) -> Any:
        return await ctx.await_for("ping", dt.timedelta(hours=1))

    job = listen.enqueue()
    assert drain(app, ["sig"]) == {"snoozed": 1}
    app.signal(job.id, "ping", 7)
    assert drain(app, ["sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == 7


def test_deleting_a_job_deletes_its_signals(app: App) -> None:
    calls: list[Any] = []
    approver(app, calls)
    job = app.get_task("approve").enqueue("o-6")
    app.signal(job.id, "unused", 1)
    assert drain(app, ["sig"]) == {"snoozed": 1}
    assert app.delete_jobs([job.id]) == 1
    assert signals(app.store, job.id) == [] and waiting(app.store, job.id) is None
