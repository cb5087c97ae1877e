"""Exactly-once effects under crashes: workers SIGKILLed, frozen past their lease, restarted.

The handlers are crash_app's ``effect``, ``frozen_effect`` and ``stepped``, run
by worker processes (``python -m conveyor worker crash_app:app``). An effect
is a row of the queue's own database written in the transaction that
completes the job (``ctx.complete``): whatever is killed when, each job ends
with exactly one. A durable step that was recorded never runs again.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict

import pytest

import crash_app
from conveyor import App, JobState
from store_fixtures import sql_only
from test_crash import (  # the fixtures too: a fleet of worker processes, crash_app's App
    Fleet,
    all_jobs,
    counts,
    crash,  # noqa: F401
    ensure_sqlite_unlocked,
    fleet,  # noqa: F401
    pid_of,
    running_on,
)
from waiting import wait_until

pytestmark = pytest.mark.slow

EFFECT_JOBS = 300
EFFECT_WORKERS = 3
EFFECT_PAUSE = 0.02
#: A kill this often, this many times at most: then the fleet finishes the work (on a
#: loaded machine a worker killed before it is up to speed would never let it end).
#: Under the 1 s lease: the first victim's jobs wait that long to be rescued, so the
#: second kill always comes before the run can end.
KILL_EVERY = 0.5
KILLS = 5


def effects_by_job(dsn: str) -> dict[int, list[tuple[int, int]]]:
    rows = crash_app.query(dsn, "SELECT job_id, attempt, pid FROM effects")
    found: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for job_id, attempt, pid in rows:
        found[int(job_id)].append((int(attempt), int(pid)))
    return found


@sql_only
def test_sigkilled_workers_leave_exactly_one_effect_per_job(
    crash: App,  # noqa: F811
    fleet: Fleet,  # noqa: F811
    dsn: str,
) -> None:
    crash.tasks["effect"].enqueue_many([((EFFECT_PAUSE,), {})] * EFFECT_JOBS)
    options = ("--concurrency", "4", "--lease", "1")
    for _ in range(EFFECT_WORKERS):
        fleet.spawn(*options)
    killed: set[int] = set()
    deadline = time.monotonic() + 60
    next_kill: float | None = None
    while True:
        seen = counts(crash)
        if seen["succeeded"] == EFFECT_JOBS:
            break
        assert time.monotonic() < deadline, f"unfinished after 60s: {seen}\n{fleet.logs()}"
        assert seen["failed"] == 0, f"jobs failed: {seen}\n{fleet.logs()}"
        if next_kill is None and seen["running"]:
            next_kill = time.monotonic() + 0.2  # the first kill once jobs run
        if next_kill is not None and time.monotonic() >= next_kill and len(killed) < KILLS:
            victim = fleet.alive()[0]  # the oldest: the one most surely holding jobs
            victim.kill()
            victim.wait(timeout=10)
            killed.add(victim.pid)
            fleet.spawn(*options)
            next_kill += KILL_EVERY
        time.sleep(0.05)
    assert len(killed) >= 2, "the run ended before the kills began: make it longer"

    jobs = all_jobs(crash)
    assert len(jobs) == EFFECT_JOBS
    assert {j.state for j in jobs} == {JobState.SUCCEEDED}
    effects = effects_by_job(dsn)
    assert set(effects) == {j.id for j in jobs}
    doubled = {job_id: rows for job_id, rows in effects.items() if len(rows) != 1}
    assert not doubled, f"jobs with more than one effect: {dict(list(doubled.items())[:10])}"
    for job in jobs:
        # The effect and the success were written by the same attempt, in one transaction.
        ((attempt, pid),) = effects[job.id]
        assert job.result == pid and job.attempts == attempt, (job.id, job.result, effects[job.id])
    events = crash.store.event_since(0, 10_000_000)
    succeeded = Counter(e.job_id for e in events if e.kind == "succeeded")
    assert all(succeeded[j.id] == 1 for j in jobs), "a job has more or fewer than one success"
    rescued = Counter(e.job_id for e in events if e.kind == "rescued")
    assert sum(rescued.values()) > 0, "no attempt was cut short: the kills proved nothing"


@sql_only
def test_a_worker_frozen_past_its_lease_gets_lease_lost_and_its_effect_rolls_back(
    crash: App,  # noqa: F811
    fleet: Fleet,  # noqa: F811
    dsn: str,
) -> None:
    """Frozen before its transaction: its late ctx.complete is refused."""
    freeze_and_resume(crash, fleet, dsn, inside=False)


# A process frozen inside a write transaction would hold SQLite's only write lock,
# and every worker would wait for it: frozen before its transaction there (above).
@pytest.mark.parametrize("dsn", ["postgres"], indirect=True)
def test_a_worker_frozen_inside_its_transaction_rolls_its_effect_back(
    crash: App,  # noqa: F811
    fleet: Fleet,  # noqa: F811
    dsn: str,
) -> None:
    """Frozen with its effect written and not committed: nobody sees it, and it never is."""
    freeze_and_resume(crash, fleet, dsn, inside=True)


def freeze_and_resume(app: App, workers: Fleet, dsn: str, inside: bool) -> None:
    def phases() -> list[tuple[str, str]]:
        rows = crash_app.query(
            dsn, "SELECT name, phase FROM runs WHERE job_id = %s ORDER BY at", (job.id,)
        )
        return [(str(name), str(phase)) for name, phase in rows]

    job = app.tasks["frozen_effect"].enqueue(1.5, inside)
    a = workers.spawn("--concurrency", "1", "--lease", "1", name="A")
    wait_until(lambda: ("A", "start") in phases(), 20, "A's handler starts")
    os.kill(a.pid, signal.SIGSTOP)
    ensure_sqlite_unlocked(dsn, a)
    if inside:  # its effect is written, not committed: nobody sees it
        assert effects_by_job(dsn) == {}
    time.sleep(1.6)  # past the lease: nobody renews it
    # What another worker's maintenance would do: the expired lease is rescued.
    assert app.store.job_rescue_expired() == [job.id]
    os.kill(a.pid, signal.SIGCONT)
    # A's handler wakes, writes its effect and calls ctx.complete under its old lease.
    wait_until(lambda: ("A", "lease lost") in phases(), 15, "A's handler hears of it")
    # The job runs again (A claims it anew) and completes on its second attempt.
    assert app.wait(job.id, timeout=20) == 2
    assert effects_by_job(dsn) == {job.id: [(2, a.pid)]}  # attempt 1's effect rolled back
    history = [e.kind for e in app.events(job.id)]
    assert history == ["enqueued", "claimed", "rescued", "claimed", "succeeded"]


STEPS = 6
STEP_PAUSE = 0.3


def test_a_handler_killed_between_steps_resumes_after_the_last_recorded_one(
    crash: App,  # noqa: F811
    fleet: Fleet,  # noqa: F811
    dsn: str,
) -> None:
    def step_runs() -> list[tuple[str, int]]:
        rows = crash_app.query(
            dsn, "SELECT name, phase FROM runs WHERE job_id = %s ORDER BY at", (job.id,)
        )
        return [(str(name), int(phase)) for name, phase in rows]

    job = crash.tasks["stepped"].enqueue(STEPS, STEP_PAUSE)
    a = fleet.spawn("--concurrency", "1", "--lease", "1", name="A")
    wait_until(lambda: running_on(crash, job.id, a), 20, "A claims the job")
    recorded = wait_until(
        lambda: (steps := crash.steps(job.id)) and len(steps) >= 2 and steps, 20, "two steps"
    )
    a.kill()
    a.wait(timeout=10)
    done_before = {step.name for step in crash.steps(job.id)}
    assert len(done_before) < STEPS and {s.name for s in recorded} <= done_before
    b = fleet.spawn("--concurrency", "1", "--lease", "1", name="B")
    assert crash.wait(job.id, timeout=30) == sum(i * 10 for i in range(STEPS))
    assert pid_of(crash.get(job.id).worker) == b.pid

    runs = step_runs()
    ran = Counter(name for name, _ in runs)
    for name in done_before:
        # Recorded before the kill: never run again.
        assert ran[name] == 1 and (name, 1) in runs, (name, runs)
    later = [f"s{i}" for i in range(STEPS) if f"s{i}" not in done_before]
    # The step cut short by the kill ran again (its result was never recorded);
    # every other step ran once, on the second attempt.
    assert ran[later[0]] in (1, 2) and (later[0], 2) in runs
    assert all(ran[name] == 1 and (name, 2) in runs for name in later[1:])
    steps = crash.steps(job.id)
    assert [s.name for s in steps] == [f"s{i}" for i in range(STEPS)]
    assert [s.attempt for s in steps] == [1 if s.name in done_before else 2 for s in steps]
    assert [s.result for s in steps] == [i * 10 for i in range(STEPS)]
