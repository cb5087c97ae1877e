"""Limits hold across a fleet: real worker processes (``conveyor worker``), on each backend.

Four worker processes of concurrency 16 work on one queue: limited to 20 jobs a
second, no sliding second ever starts more than 20 (read from the times of the
``claimed`` events, the moments the claims counted by); limited to 3 at once,
never more than 3 run at once (read from the handlers' own clocks, and from the
store while they run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import limits_app
from conveyor import App, JobState
from conveyor.job import Job

TESTS_DIR = Path(__file__).resolve().parent
PROCESSES = 4
CONCURRENCY = 16
DEADLINE = 60.0

pytestmark = pytest.mark.slow


class Fleet:
    """Worker processes of limits_app; each one's output goes to a log file."""

    def __init__(self, dsn: str, log_dir: Path) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def spawn(self, queue: str) -> None:
        env = {
            **os.environ,
            "CONVEYOR_DSN": self.dsn,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        for number in range(PROCESSES):
            log = open(self.log_dir / f"worker-{number}.log", "wb")  # noqa: SIM115
            self._logs.append(log)
            argv = [sys.executable, "-m", "conveyor", "worker", "limits_app:app"]
            options = ["--queues", queue, "--concurrency", str(CONCURRENCY)]
            self.procs.append(
                subprocess.Popen(
                    [*argv, *options, "--log-level", "WARNING"],
                    cwd=TESTS_DIR,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def logs(self) -> str:
        return "\n".join(
            f"--- worker {n} ---\n" + (self.log_dir / f"worker-{n}.log").read_text(errors="replace")
            for n in range(len(self.procs))
        )

    def close(self) -> None:
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()  # SIGTERM: a drain
            for proc in self.procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    # Reaped late on a loaded machine; one left unwaited is a
                    # ResourceWarning in a later test.
                    proc.wait(timeout=60)
        finally:
            for log in self._logs:
                log.close()


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    workers = Fleet(dsn, tmp_path)
    try:
        yield workers
    finally:
        workers.close()


@pytest.fixture
def fleet_app(dsn: str) -> Iterator[App]:
    with limits_app.build(dsn) as application:
        application.migrate()
        yield application


def wait_all_done(app: App, jobs: list[Job], fleet: Fleet) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        states = [app.get(job.id).state for job in jobs]
        if all(state == JobState.SUCCEEDED for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not all done: {states}\n{fleet.logs()}")
        time.sleep(0.1)


def event_times(app: App, job: Job, kind: str) -> list[float]:
    return [e.at.timestamp() for e in app.events(job.id) if e.kind == kind]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment (a span ending when another starts: not both)."""
    edges = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_rate_limit_holds_across_worker_processes(fleet_app: App, fleet: Fleet) -> None:
    app = fleet_app
    app.limit("paced", rate="20/s")
    jobs = app.tasks["tick"].enqueue_many([((), {})] * 120)
    fleet.spawn("paced")
    wait_all_done(app, jobs, fleet)

    starts = sorted(t for job in jobs for t in event_times(app, job, "claimed"))
    assert len(starts) == len(jobs)  # each claimed once
    # No sliding second holds more than 20 starts: the 21st after any start is at
    # least a second later (a window is (t - 1 s, t]).
    crowded = [
        (starts[i], starts[i + 20])
        for i in range(len(starts) - 20)
        if starts[i + 20] - starts[i] < 1.0
    ]
    assert not crowded, crowded[:5]
    # And the limit is used, not merely obeyed: 120 jobs at 20/s take about 5 s
    # once the workers are up (64 slots would run them in well under one).
    took = starts[-1] - starts[0]
    assert 5.0 <= took < 9.0, took


class RunningSampler:
    """Reads, as often as it can, how many jobs of a queue the store has running."""

    def __init__(self, app: App, queue: str) -> None:
        self.app = app
        self.queue = queue
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = self.app.count_jobs(queue=self.queue, state="running")
            self.samples.append(counts.get("running", 0))

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_a_concurrency_limit_holds_across_worker_processes(fleet_app: App, fleet: Fleet) -> None:
    app = fleet_app
    app.limit("capped", concurrency=3)
    jobs = app.tasks["hold"].enqueue_many([((0.15,), {})] * 40)
    with RunningSampler(app, "capped") as sampler:
        fleet.spawn("capped")
        wait_all_done(app, jobs, fleet)

    # The handlers' own clocks: never more than 3 ran at once, and 3 did.
    handled = [(begun, ended) for begun, ended in (app.get(job.id).result for job in jobs)]
    assert most_at_once(handled) == 3
    # The store's view, read again and again while they ran: never more than 3
    # running. (Not from the events' times: on PostgreSQL an event's time is its
    # transaction's start, a moment before the snapshot its claim counted on.)
    assert len(sampler.samples) > 20
    assert max(sampler.samples) == 3
    # A freed slot is taken at once (the fallback poll is a second): 40 jobs of
    # 0.15 s three at a time take about 2 s.
    took = max(end for _, end in handled) - min(begun for begun, _ in handled)
    assert took < 5.0, took
