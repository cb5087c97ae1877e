"""conveyor.testing on both backends: drain, inline, and the enqueue assertions."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import App, Context, Fail, FixedBackoff, JobFailed, JobState, Retry
from conveyor.testing import assert_enqueued, drain, enqueued_jobs, inline, refute_enqueued


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


def test_drain_runs_ready_jobs_through_the_store(app: App) -> None:
    seen: list[float] = []

    @app.task(queue="math")
    def add(ctx: Context, a: int, b: int) -> int:
        seen.append(ctx.progress(0.5, "half way"))
        return a + b

    @app.task(queue="math", max_attempts=2, backoff=FixedBackoff(60))
    def flaky() -> None:
        raise RuntimeError("not yet")

    @app.task(queue="math", max_attempts=5)
    def hopeless() -> None:
        raise Fail("no point in retrying")

    @app.task(queue="other")
    def elsewhere() -> str:
        return "ran"

    added = add.enqueue(2, 3)
    retrying = flaky.enqueue()
    failing = hopeless.enqueue()
    other = elsewhere.enqueue()
    later = add.options(delay=3600).enqueue(1, 1)

    assert drain(app, queues=["math"]) == {"succeeded": 1, "retried": 1, "failed": 1}
    done = app.get(added.id)
    assert done.state == JobState.SUCCEEDED and done.result == 5 and done.attempts == 1
    assert seen == [True]  # progress went to the store under the job's lease
    assert kinds(app, added.id) == ["enqueued", "claimed", "succeeded"]
    assert app.get(retrying.id).state == JobState.QUEUED  # waiting out its 60 s backoff
    assert "RuntimeError: not yet" in (app.get(retrying.id).error or "")
    assert app.get(failing.id).state == JobState.FAILED
    assert app.get(other.id).state == JobState.QUEUED  # not a drained queue
    assert app.get(later.id).state == JobState.QUEUED  # not due
    assert drain(app, queues=["math"]) == {}

    # With scheduled jobs: the retry and the deferred job run now.
    assert drain(app, queues=["math"], with_scheduled=True) == {"failed": 1, "succeeded": 1}
    assert app.get(retrying.id).attempts == 2
    assert app.get(later.id).state == JobState.SUCCEEDED
    assert drain(app) == {"succeeded": 1}  # every queue of the app's tasks
    assert app.get(other.id).result == "ran"


def test_drain_runs_async_handlers_snoozes_and_poison_jobs(app: App) -> None:
    @app.task
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @app.task
    def sleepy(ctx: Context) -> str:
        if ctx.job.run_at <= ctx.job.created_at:
            raise Retry(3600)
        return "woke"

    doubled = double.enqueue(21)
    snoozed = sleepy.enqueue()
    poison = app.enqueue("no_such_task", queue="default")
    assert drain(app) == {"succeeded": 1, "snoozed": 1, "failed": 1}
    assert app.get(doubled.id).result == 42
    assert app.get(snoozed.id).state == JobState.QUEUED
    assert "no task named 'no_such_task'" in (app.get(poison.id).error or "")
    assert drain(app, with_scheduled=True) == {"succeeded": 1}
    assert app.get(snoozed.id).result == "woke"


def test_drain_stops_at_its_limit(app: App) -> None:
    @app.task
    def again() -> None:
        raise Retry(0)

    job = again.enqueue()
    assert drain(app, limit=5) == {"snoozed": 5}
    assert app.get(job.id).state == JobState.QUEUED


def test_inline_runs_jobs_before_enqueue_returns(app: App) -> None:
    @app.task(queue="mail")
    def send(to: str) -> str:
        return f"sent to {to}"

    @app.task(queue="signup")
    def signup(email: str) -> int:
        return send.enqueue(email).id

    @app.task(max_attempts=3, backoff=FixedBackoff(600))
    def broken() -> None:
        raise ValueError("always")

    with inline(app):
        job = signup.enqueue("ada@example.com")
        assert job.state == JobState.SUCCEEDED
        mail = app.get(job.result)
        assert mail.state == JobState.SUCCEEDED and mail.result == "sent to ada@example.com"
        assert job.wait(timeout=1) == mail.id
        failed = broken.enqueue()
        assert failed.state == JobState.FAILED and failed.attempts == 3
        assert "ValueError: always" in (failed.error or "")
        with pytest.raises(JobFailed):
            failed.wait(timeout=1)
    # After the block, enqueueing is back to normal: the job waits for a worker.
    assert send.enqueue("bob@example.com").state == JobState.QUEUED
    assert "enqueue_calls" not in vars(app)


def test_inline_without_scheduled_leaves_a_retry_waiting(app: App) -> None:
    @app.task(max_attempts=3, backoff=FixedBackoff(600))
    def broken() -> None:
        raise ValueError("always")

    with inline(app, with_scheduled=False):
        job = broken.enqueue()
    assert job.state == JobState.QUEUED and job.attempts == 1


def test_assert_and_refute_enqueued(app: App) -> None:
    @app.task(queue="mail")
    def send(to: str, subject: str = "hi", lang: str = "en") -> None:
        return None

    @app.task
    def other() -> None:
        return None

    first = send.enqueue("ada@example.com", subject="welcome")
    send.options(queue="bulk").enqueue("bob@example.com")

    assert assert_enqueued(app, send, args=["ada@example.com"]).id == first.id
    assert assert_enqueued(app, "send", kwargs={"subject": "welcome"}).id == first.id
    assert_enqueued(app, send, args=["bob@example.com"], queue="bulk")
    refute_enqueued(app, send, args=["bob@example.com"], queue="mail")
    refute_enqueued(app, other)

    with pytest.raises(AssertionError, match=r"the task has:\n  job .*ada@example\.com"):
        assert_enqueued(app, send, args=["carol@example.com"])
    with pytest.raises(AssertionError, match="no job of the task is"):
        assert_enqueued(app, other)
    with pytest.raises(AssertionError, match="expected no job of 'send'"):
        refute_enqueued(app, send, kwargs={"subject": "welcome"})

    assert len(enqueued_jobs(app, send)) == 2
    drain(app, ["mail"])
    # Run jobs are no longer "enqueued", but still found in every state.
    refute_enqueued(app, send, args=["ada@example.com"])
    assert [j.id for j in enqueued_jobs(app, send, state=None, queue="mail")] == [first.id]


def test_enqueued_jobs_reads_past_one_page(app: App) -> None:
    @app.task
    def item(n: int) -> None:
        return None

    item.enqueue_many([([n], {}) for n in range(1203)])
    found = enqueued_jobs(app, item)
    assert [j.args[0] for j in found] == list(range(1203))  # oldest first
    assert [j.args[0] for j in enqueued_jobs(app, item, args=[1202])] == [1202]


def test_jobs_found_by_the_helpers_can_be_waited_for(app: App) -> None:
    from conveyor.testing import drain

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    add.enqueue(2, 3)
    (found,) = enqueued_jobs(app, add, args=[2, 3])
    drain(app)
    assert found.refresh().state == JobState.SUCCEEDED
    assert found.wait(timeout=5) == 5
