"""``app.on_change`` tells of claims and holds on every store, not only on SQLite.

SQLite's file watch hears every commit (as "any"); PostgreSQL and Redis send
no notification for a claim or a hold. So the App says "claimed" (by its
workers, its consumers, inline) and "held" in its own process, on every store,
without a statement more.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest

from conveyor import App, Change
from conveyor.store.postgres import listener as pg_listener

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def heard(app: App) -> Iterator[queue.SimpleQueue[Change]]:
    changes: queue.SimpleQueue[Change] = queue.SimpleQueue()
    with app.on_change(changes.put):
        yield changes


def wait_for(changes: queue.SimpleQueue[Change], kind: str, job_id: int) -> Change:
    """The first change of ``kind`` that names ``job_id`` (others are passed over)."""
    deadline = time.monotonic() + DEADLINE
    while (left := deadline - time.monotonic()) > 0:
        try:
            change = changes.get(timeout=left)
        except queue.Empty:
            break
        if change.kind == kind and job_id in change.job_ids:
            return change
    raise AssertionError(f"not heard within {DEADLINE}s: {kind} of job {job_id}")


def test_a_workers_claim_and_a_hold_are_heard(app: App, heard: queue.SimpleQueue[Change]) -> None:
    @app.task(queue="q")
    def work() -> str:
        return "ok"

    held = work.enqueue()
    app.hold(held.id)
    assert wait_for(heard, "held", held.id).job_ids == (held.id,)
    by_filter = work.enqueue()
    assert app.hold_jobs(queue="q") == 1
    wait_for(heard, "held", by_filter.id)
    job = work.enqueue()
    worker = app.worker(queues=["q"], burst=True, maintenance=False)
    with worker:
        assert worker.wait_stopped(30)
    assert wait_for(heard, "claimed", job.id).queue is None
    assert wait_for(heard, "done", job.id)


def test_a_consumers_claim_is_heard(app: App, heard: queue.SimpleQueue[Change]) -> None:
    job_id = app.enqueue("t", queue="q").id
    for consumed in app.consume(["q"], idle_timeout=5):
        wait_for(heard, "claimed", job_id)
        consumed.complete()
        break
