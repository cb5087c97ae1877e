"""Behaviours the queue systems conveyor was specified from have, on every store.

A finished job keeps its last progress; the pull API fails for good, takes a
batch and has its pacing as settings; notifications can be turned off; the
store says what it can do; housekeeping runs wherever jobs are consumed.
"""

from __future__ import annotations

import time

import pytest

from conveyor import App, Context, JobState
from conveyor.store.postgres import listener as pg_listener

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


# --- progress ends true ------------------------------------------------------------


def test_a_finished_job_shows_the_last_progress_it_reported(app: App) -> None:
    @app.task
    def steps(ctx: Context) -> str:
        for step in range(1, 31):
            ctx.progress(step / 30, f"step {step}")  # most wait for their turn
            time.sleep(0.005)
        return "done"

    with app.worker(concurrency=1, maintenance=False):
        job = steps.enqueue()
        assert job.wait(timeout=DEADLINE) == "done"
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED
    assert (done.progress, done.progress_message) == (1.0, "step 30")


def test_a_failed_job_shows_the_last_progress_it_reported(app: App) -> None:
    @app.task(max_attempts=1)
    def breaks(ctx: Context) -> None:
        ctx.progress(0.1, "start")
        ctx.progress(0.4, "page 4")
        raise RuntimeError("broken at page 4")

    with app.worker(concurrency=1, maintenance=False):
        job = breaks.enqueue()
        with pytest.raises(Exception, match="broken at page 4"):
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert done.state == JobState.FAILED
    assert (done.progress, done.progress_message) == (0.4, "page 4")
