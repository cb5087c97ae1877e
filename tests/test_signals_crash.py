"""Sleeps, signals and children under crashes: worker processes SIGKILLed again and again
while durable handlers record a step, sleep, wait for a signal, spawn a child, wait for it and
record another step (tests/durable_tasks.py), on every store. Whatever was killed
when: no step runs again once recorded, each signal is taken once and none is lost,
and each parent has exactly one child."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import pytest

import crash_app
from conveyor import App, JobState
from conveyor.signals import signals, waiting
from test_crash import (  # the fixtures too: a fleet of worker processes, crash_app's App
    Fleet,
    all_jobs,
    counts,
    crash,  # noqa: F401
    fleet,  # noqa: F401
)

pytestmark = pytest.mark.slow

PARENTS = 12
PAUSE = 0.15
KILL_EVERY = 0.6
KILLS = 5


def runs_by_job(dsn: str) -> dict[int, list[tuple[str, int]]]:
    rows = crash_app.query(dsn, "SELECT job_id, name, phase FROM runs ORDER BY at")
    found: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for job_id, name, phase in rows:
        found[int(job_id)].append((str(name), int(phase)))
    return found


def test_killed_workers_lose_no_signal_take_none_twice_and_spawn_each_child_once(
    crash: App,  # noqa: F811
    fleet: Fleet,  # noqa: F811
    dsn: str,
) -> None:
    flow = crash.tasks["durable_flow"]
    parents = [flow.enqueue(PAUSE) for _ in range(PARENTS)]
    # A third signalled before any worker runs: kept until the wait takes it.
    for job in parents[: PARENTS // 3]:
        crash.signal(job.id, "go", {"job": job.id})
    options = ("--concurrency", "3", "--lease", "1")
    for _ in range(2):
        fleet.spawn(*options)
    unsignalled = parents[PARENTS // 3 :]
    killed = 0
    started = time.monotonic()
    next_kill: float | None = None
    deadline = started + 120
    while True:
        seen = counts(crash)
        if seen["succeeded"] == 2 * PARENTS:
            break
        assert time.monotonic() < deadline, f"unfinished: {seen}\n{fleet.logs()}"
        assert seen["failed"] == 0, f"jobs failed: {seen}\n{fleet.logs()}"
        if unsignalled and time.monotonic() > started + 0.3 * (PARENTS - len(unsignalled)):
            job = unsignalled.pop(0)  # some while they run, some while they are parked
            crash.signal(job.id, "go", {"job": job.id})
        if next_kill is None and seen["running"]:
            next_kill = time.monotonic() + 0.2  # the first kill once jobs run
        if next_kill is not None and time.monotonic() >= next_kill and killed < KILLS:
            victim = fleet.alive()[0]
            victim.kill()
            victim.wait(timeout=10)
            killed += 1
            fleet.spawn(*options)
            next_kill += KILL_EVERY
        time.sleep(0.05)
    assert killed >= 2, "the run ended before the kills began: make it longer"

    jobs = {j.id: j for j in all_jobs(crash)}
    children = [j for j in jobs.values() if j.task == "durable_child"]
    # One child per parent, however often the spawn was replayed.
    assert Counter(j.key for j in children) == {f"spawn:{p.id}:1": 1 for p in parents}
    runs = runs_by_job(dsn)
    for parent in parents:
        done = jobs[parent.id]
        assert done.state == JobState.SUCCEEDED
        assert done.result == [{"job": parent.id}, [7]]
        # The signal: taken once, by the one wait, never twice.
        (sent,) = signals(crash.store, parent.id)
        assert sent.step == "signal-go-1" and sent.received_at is not None
        steps = {s.name: s for s in crash.steps(parent.id)}
        assert set(steps) == {"before", "sleep-1", "signal-go-1", "spawn-1", "wait-1", "after"}
        assert waiting(crash.store, parent.id) is None  # every wait ended, the sleep's too
        assert steps["signal-go-1"].result == {"payload": {"job": parent.id}}
        # A step may run again only on an attempt before the one that recorded it.
        for name in ("before", "after"):
            attempts = [a for n, a in runs[parent.id] if n == name]
            assert attempts and max(attempts) == steps[name].attempt, (name, attempts)
            assert Counter(attempts)[steps[name].attempt] == 1
    rescued = sum(1 for e in crash.store.event_since(0, 10_000_000) if e.kind == "rescued")
    assert rescued > 0, "no attempt was cut short: the kills proved nothing"
