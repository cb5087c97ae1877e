"""A mixed fleet (a rolling deploy): workers that do not know a task pass its jobs on.

An old worker beside a new one, on the same store, each with its own App and
task registry: every job of the task only the new one knows succeeds, none
uses an attempt on the old one, and a task no worker knows fails for good only
after the worker's patience, with an error that says so; on every store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conveyor import App, JobState
from conveyor.job import utcnow
from conveyor.store.postgres import listener as pg_listener
from conveyor.worker.executor import unknown_since
from waiting import wait_until

JOBS = 40


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def old_app(dsn: str) -> Iterator[App]:
    """The release before: it knows ``old`` only, on the same queue."""
    with App(dsn) as application:
        application.migrate()

        @application.task(queue="q")
        def old() -> str:
            return "old"

        yield application


@pytest.fixture
def new_app(dsn: str, old_app: App) -> Iterator[App]:
    """The release being rolled out: it knows ``old`` and the new task ``fresh``."""
    with App(dsn) as application:

        @application.task(queue="q")
        def old() -> str:
            return "old"

        @application.task(queue="q", max_attempts=1)
        def fresh(n: int) -> int:
            return n * 2

        yield application


def test_every_job_of_a_new_task_succeeds_in_a_mixed_fleet(old_app: App, new_app: App) -> None:
    # Enqueued before either worker runs: the old worker, started first, meets them first.
    jobs = [new_app.enqueue("fresh", [n], queue="q", max_attempts=1) for n in range(JOBS)]
    olds = [old_app.enqueue("old", queue="q") for _ in range(5)]
    old_worker = old_app.worker(queues=["q"], concurrency=4, maintenance=False, name="old")
    new_worker = new_app.worker(queues=["q"], concurrency=4, maintenance=False, name="new")
    with old_worker:
        wait_until(lambda: old_worker.counts["snoozed"] > 0, what="the old worker met a new job")
        with new_worker:
            wait_until(
                lambda: all(new_app.get(j.id).state == JobState.SUCCEEDED for j in jobs),
                timeout=60,
                what="every job of the new task succeeded",
            )
    ended = [new_app.get(j.id) for j in jobs]
    assert [j.result for j in ended] == [n * 2 for n in range(JOBS)]
    # One attempt each (max_attempts=1): the old worker's claims gave theirs back.
    assert {j.attempts for j in ended} == {1}
    assert all(old_app.get(j.id).state == JobState.SUCCEEDED for j in olds)
    assert old_worker.counts["failed"] == 0
    passed_on = [e for j in jobs for e in new_app.events(j.id) if e.kind == "snoozed"]
    assert passed_on and {e.worker for e in passed_on} == {"old"}


def test_a_task_no_worker_knows_fails_for_good_after_the_patience(old_app: App) -> None:
    stranger = old_app.enqueue("nobody_knows", queue="q", max_attempts=3)
    started = utcnow()
    worker = old_app.worker(
        queues=["q"], concurrency=1, maintenance=False, name="old", unknown_task_patience=1.5
    )
    with worker:
        passed = wait_until(
            lambda: old_app.get(stranger.id).error, what="the job was passed on once"
        )
        assert "no task named 'nobody_knows' is registered with worker old" in passed
        since = unknown_since(passed)
        assert since is not None and started <= since <= utcnow()
        failed = wait_until(
            lambda: (j := old_app.get(stranger.id)).state == JobState.FAILED and j,
            timeout=30,
            what="the job failed for good",
        )
    assert failed.error is not None
    assert "no worker knew task 'nobody_knows' for" in failed.error
    assert f"since {since.isoformat()}" in failed.error
    assert failed.attempts == 1  # passed on without using one; the last claim failed it
    kinds = [e.kind for e in old_app.events(stranger.id)]
    assert kinds[0] == "enqueued" and kinds[-1] == "failed"
    assert "snoozed" in kinds
