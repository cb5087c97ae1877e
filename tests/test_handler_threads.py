"""The threads that run sync handlers: on demand, bounded, and nothing starts after close."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from conveyor import App
from conveyor.context import Context
from conveyor.job import utcnow
from conveyor.worker.executor import Running, poison_outcome
from conveyor.worker.handler_threads import HandlerThreads

release = threading.Event()
entered: list[int] = []


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    release.clear()
    entered.clear()
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:

        @application.task()
        def hold(n: int) -> int:
            entered.append(n)
            release.wait(10)
            return n

        yield application


def claimed(app: App, count: int) -> list[Running]:
    app.get_task("hold").enqueue_many([((n,), {}) for n in range(count)])
    jobs = app.store.job_claim(["default"], count, "w", timedelta(seconds=60), utcnow())
    runnings = []
    for job in sorted(jobs, key=lambda j: j.id):
        running = Running(job=job, task=app.get_task("hold"), context=Context(job))
        assert poison_outcome(running) is None
        runnings.append(running)
    return runnings


def test_runs_up_to_size_at_once_and_reports_each(app: App) -> None:
    done: list[Running] = []
    finished = threading.Semaphore(0)

    def on_done(running: Running) -> None:
        done.append(running)
        finished.release()

    threads = HandlerThreads(2, done=on_done)
    for running in claimed(app, 3):
        threads.submit(running)
    deadline = time.monotonic() + 5
    while len(entered) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert sorted(entered) == [0, 1]  # the third waits for a free thread
    release.set()
    for _ in range(3):
        assert finished.acquire(timeout=5)
    assert sorted(r.outcome.result_json for r in done if r.outcome) == ["0", "1", "2"]
    threads.close()


def test_work_not_started_before_close_never_starts(app: App) -> None:
    reported: list[Running] = []
    threads = HandlerThreads(1, done=reported.append)
    first, second = claimed(app, 2)
    threads.submit(first)
    threads.submit(second)
    while not entered:
        time.sleep(0.01)
    threads.close()
    release.set()
    for thread in threads._threads:
        thread.join(5)
    assert entered == [0]
    assert reported == [first]
    with pytest.raises(RuntimeError, match="closed"):
        threads.submit(second)
