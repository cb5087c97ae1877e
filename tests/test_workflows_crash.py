"""A parent's worker killed mid-run (SIGKILL): its children keep waiting, and run after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import flows_app
from conveyor import JobState
from conveyor.testing import drain
from waiting import wait_until

pytestmark = pytest.mark.slow

TESTS_DIR = Path(__file__).resolve().parent


def spawn_worker(dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONVEYOR_DSN": dsn,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "conveyor", "worker", "flows_app:app", "--lease", "2"],
            cwd=TESTS_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_killed_parents_children_keep_waiting_and_run_after_it(dsn: str, tmp_path: Path) -> None:
    app = flows_app.build(dsn)
    app.migrate()
    hang = app.get_task("hang")
    quick = app.get_task("quick")
    join = app.get_task("join")
    parent = hang.enqueue()
    other = quick.enqueue()
    child = join.options(after=[parent, other]).enqueue()
    proc = spawn_worker(dsn, tmp_path / "worker.log")
    try:
        wait_until(lambda: app.get(parent.id).state == JobState.RUNNING, 30, "the parent runs")
        wait_until(lambda: app.get(other.id).state == JobState.SUCCEEDED, 30, "the other ends")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)

    assert app.get(child.id).state == JobState.WAITING
    later = datetime.now(UTC) + timedelta(seconds=30)
    assert app.store.job_rescue_expired(later) == [parent.id]
    assert app.get(parent.id).state == JobState.QUEUED
    assert app.get(child.id).state == JobState.WAITING

    # The second attempt of the parent runs here, at once.
    assert drain(app, with_scheduled=True) == {"succeeded": 2}
    assert app.get(child.id).result == {str(parent.id): "attempt 2", str(other.id): "quick"}
    app.close()
