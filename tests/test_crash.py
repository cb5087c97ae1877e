"""Workers as real processes, killed, frozen, drained, and a database restarted under them.

Each worker here is ``python -m conveyor worker crash_app:app`` in a process
of its own; the handlers (tests/crash_app.py) leave traces in tables of the
same database, so these tests check what actually ran, where and when, against
the history the store recorded. Every wait polls with a deadline, and every
process started here is killed in a ``finally`` block.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TypeVar

import psycopg
import pytest

import crash_app
from conveyor import App, Job, JobState
from conveyor.store.dsn import sqlite_path
from outcomes import listed
from pg_server import PgServer
from waiting import wait_until

#: Whole processes started and killed: left out of the fast inner loop.
pytestmark = pytest.mark.slow

T = TypeVar("T")

TESTS_DIR = Path(__file__).resolve().parent


# --- helpers ---------------------------------------------------------------------------


def pid_of(worker_id: str | None) -> int | None:
    """The process id inside a worker id (``host:pid:suffix``)."""
    if not worker_id:
        return None
    parts = worker_id.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


class Fleet:
    """Worker processes of crash_app; each one's output goes to a log file."""

    def __init__(self, dsn: str, log_dir: Path) -> None:
        self.dsn = dsn
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def spawn(self, *options: str, name: str | None = None) -> subprocess.Popen[bytes]:
        number = len(self.procs)
        env = {
            **os.environ,
            "CONVEYOR_DSN": self.dsn,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH", "")) if p
            ),
            "CRASH_WORKER_NAME": name or f"w{number}",
        }
        log = open(self.log_dir / f"worker-{number}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        argv = [sys.executable, "-m", "conveyor", "worker", "crash_app:app"]
        proc = subprocess.Popen(
            [*argv, "--log-level", "WARNING", *options],
            cwd=TESTS_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def logs(self, lines: int = 15) -> str:
        out = []
        for number, proc in enumerate(self.procs):
            path = self.log_dir / f"worker-{number}.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            out.append(f"--- worker {number} (pid {proc.pid}, exit {proc.poll()}) ---")
            out.extend(text)
        return "\n".join(out)

    def close(self) -> None:
        try:
            for proc in self.procs:
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)  # a frozen process too
                    proc.kill()
            for proc in self.procs:
                # Generous: a SIGKILLed process is reaped late on a loaded machine,
                # and one left unwaited is a ResourceWarning in a later test.
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
def crash(dsn: str) -> Iterator[App]:
    """The crash_app tasks on a fresh, migrated database with the trace tables."""
    with crash_app.build(dsn) as application:
        application.migrate()
        crash_app.create_tables(dsn)
        yield application
    if crash_app.trace_dsn(dsn) != dsn:  # Redis: its trace file is the test's own
        sqlite_path(crash_app.trace_dsn(dsn)).unlink(missing_ok=True)


def is_registered(app: App, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"worker {proc.pid} exited with {proc.returncode}")
    return any(w.pid == proc.pid for w in app.store.worker_list())


def counts(app: App) -> Counter[str]:
    total: Counter[str] = Counter()
    for queue in app.stats().queues.values():
        total.update(queue.counts)
    return total


def all_jobs(app: App) -> list[Job]:
    return listed(app.store, limit=1_000_000)


def running_on(app: App, job_id: int, proc: subprocess.Popen[bytes]) -> Job | None:
    job = app.get(job_id)
    return job if job.state == JobState.RUNNING and pid_of(job.worker) == proc.pid else None


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


def ensure_sqlite_unlocked(dsn: str, proc: subprocess.Popen[bytes]) -> None:
    """Leave a stopped process stopped only where it holds no SQLite write lock.

    A process frozen inside a write transaction would block every other writer
    of the file, which no queue on SQLite can avoid; let it finish and stop it
    again.
    """
    if not dsn.startswith("sqlite:"):
        return
    for _ in range(50):
        probe = sqlite3.connect(sqlite_path(dsn), timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.005)
            os.kill(proc.pid, signal.SIGSTOP)
        finally:
            probe.close()
    raise AssertionError("the stopped worker keeps holding the SQLite write lock")


# --- 1. SIGKILL ------------------------------------------------------------------------

CRASH_JOBS = 2000
CRASH_WORKERS = 4
#: Each job sleeps this long: the run lasts long enough for a kill every CRASH_KILL_EVERY.
CRASH_PAUSE = 0.05
#: Seconds between two kills at least, and jobs that must succeed between them.
CRASH_KILL_EVERY = 0.5
CRASH_KILL_AFTER = 50
#: Seconds the whole run may take (a loaded machine's worker starts take seconds each).
CRASH_DEADLINE = 240


@pytest.mark.timeout(CRASH_DEADLINE + 60)
def test_sigkilled_workers_lose_no_job(crash: App, fleet: Fleet, dsn: str) -> None:
    crash.tasks["record"].enqueue_many([((CRASH_PAUSE,), {})] * CRASH_JOBS)
    options = ("--concurrency", "4", "--lease", "1")
    for _ in range(CRASH_WORKERS):
        fleet.spawn(*options)
    killed: set[int] = set()
    started = time.monotonic()
    deadline = started + CRASH_DEADLINE
    next_kill = started + CRASH_KILL_EVERY
    done_at_kill = 0
    while True:
        seen = counts(crash)
        if seen["succeeded"] == CRASH_JOBS:
            break
        assert time.monotonic() < deadline, (
            f"unfinished after {CRASH_DEADLINE}s: {seen}\n{fleet.logs()}"
        )
        assert seen["failed"] == 0, f"jobs failed: {seen}\n{fleet.logs()}"
        # A kill once the fleet got work done since the last one: on a loaded
        # machine a restarted worker takes seconds to start, and kills on the
        # clock alone would keep the fleet from ever finishing.
        progressed = seen["succeeded"] - done_at_kill >= CRASH_KILL_AFTER
        if time.monotonic() >= next_kill and progressed:
            # The oldest worker that holds jobs: one still starting (seconds, on a
            # loaded machine) is never killed, so the fleet always gets work done.
            holding = {pid_of(j.worker) for j in crash.jobs(state="running", limit=1000)}
            victims = [p for p in fleet.alive() if p.pid in holding]
            if victims:
                victim = victims[0]
                victim.kill()
                victim.wait(timeout=60)
                killed.add(victim.pid)
                fleet.spawn(*options)
                next_kill = time.monotonic() + CRASH_KILL_EVERY
                done_at_kill = seen["succeeded"]
        time.sleep(0.05)
    elapsed = time.monotonic() - started

    jobs = all_jobs(crash)
    assert len(jobs) == CRASH_JOBS
    assert {j.state for j in jobs} == {JobState.SUCCEEDED}
    assert all(j.result == j.id for j in jobs)
    assert not {"queued", "running"} & {k for k, v in counts(crash).items() if v}

    events = crash.store.event_since(0, 10_000_000)
    succeeded = Counter(e.job_id for e in events if e.kind == "succeeded")
    assert all(succeeded[j.id] == 1 for j in jobs), "a job has more or fewer than one success"
    assert len(succeeded) == CRASH_JOBS
    rescued_events = [e for e in events if e.kind == "rescued"]
    rescued = Counter(e.job_id for e in rescued_events)

    runs: dict[int, list[int]] = defaultdict(list)
    for job_id, pid in crash_app.query(dsn, "SELECT job_id, worker_pid FROM done"):
        runs[job_id].append(pid)
    missing = {j.id for j in jobs} - set(runs)
    assert not missing, f"succeeded but never ran: {sorted(missing)[:20]}"
    duplicates = {job_id: pids for job_id, pids in runs.items() if len(pids) > 1}
    for job_id, pids in duplicates.items():
        # Ran again only after a rescue, and every run but one was on a killed worker.
        assert len(pids) - 1 <= rescued[job_id], (job_id, pids, rescued[job_id])
        assert sum(pid in killed for pid in pids) >= len(pids) - 1, (job_id, pids, killed)
    extra_runs = sum(len(p) - 1 for p in duplicates.values())
    assert extra_runs <= len(rescued_events)
    # Only the killed workers lost jobs: no live worker's lease ran out.
    assert {pid_of(e.worker) for e in rescued_events} <= killed
    assert len(killed) >= 3 and rescued_events, (len(killed), len(rescued_events))
    print(
        f"{dsn.split(':')[0]}: {CRASH_JOBS} jobs in {elapsed:.1f}s, {len(killed)} kills, "
        f"{len(rescued_events)} rescues, {extra_runs} repeated runs"
    )


# --- 2. a frozen worker ----------------------------------------------------------------


def test_frozen_worker_cannot_overwrite_the_outcome(crash: App, fleet: Fleet, dsn: str) -> None:
    def phases() -> list[tuple[str, str]]:
        rows = crash_app.query(dsn, "SELECT name, phase FROM runs WHERE job_id = %s", (job.id,))
        return sorted(rows)

    job = crash.tasks["sleepy"].enqueue(3.0)
    a = fleet.spawn("--concurrency", "1", "--lease", "1", name="A")
    wait_until(lambda: running_on(crash, job.id, a), 20, "A claims the job")
    wait_until(lambda: ("A", "start") in phases(), 10, "A's handler starts")
    os.kill(a.pid, signal.SIGSTOP)
    ensure_sqlite_unlocked(dsn, a)
    lease_end = crash.get(job.id).lease_expires_at  # A renews it no more
    assert lease_end is not None
    b = fleet.spawn("--concurrency", "1", "--lease", "1", name="B")
    # A's lease (and its maintenance leadership, if it had it) runs out; B rescues and runs.
    b_claim = wait_until(lambda: running_on(crash, job.id, b), 20, "B runs the rescued job")
    assert b_claim.attempts == 2
    assert b_claim.started_at is not None and b_claim.started_at > lease_end
    os.kill(a.pid, signal.SIGCONT)
    # A's handler wakes and returns "A" while B still holds the job.
    wait_until(lambda: ("A", "end") in phases(), 10, "A's handler finishes")
    assert crash.get(job.id).state == JobState.RUNNING
    assert crash.wait(job.id, timeout=15) == "B"
    # A drains and exits: whatever it had to write is written by then.
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=15) == 0
    final = crash.get(job.id)
    assert final.state == JobState.SUCCEEDED and final.result == "B"
    assert pid_of(final.worker) == b.pid
    assert phases() == [("A", "end"), ("A", "start"), ("B", "end"), ("B", "start")]
    history = crash.events(job.id)
    assert [e.kind for e in history] == ["enqueued", "claimed", "rescued", "claimed", "succeeded"]
    assert pid_of(history[2].worker) == a.pid
    assert pid_of(history[4].worker) == b.pid


def test_a_claim_parked_behind_a_frozen_attempt_keeps_its_lease(
    crash: App, fleet: Fleet, dsn: str
) -> None:
    """Frozen past two leases while a sync handler runs, the worker claims the job again.

    The new claim waits (parked) for the old handler, which ignores its stop
    request; meanwhile a rescuer sweeps expired leases every 0.1 s, as other
    workers' maintenance would. The parked claim's lease must be renewed while
    it waits, and it starts only after the old handler returned: the handler
    never runs twice at once, and the job succeeds on its second attempt.
    """

    def runs() -> list[tuple[str, str, float]]:
        rows = crash_app.query(
            dsn, "SELECT name, phase, at FROM runs WHERE job_id = %s ORDER BY at", (job.id,)
        )
        return [(str(n), str(p), float(a)) for n, p, a in rows]

    job = crash.tasks["stubborn"].enqueue(6.0)
    a = fleet.spawn("--concurrency", "2", "--lease", "1", name="A")
    wait_until(lambda: ("A:1", "start") in [(n, p) for n, p, _ in runs()], 20, "A starts")
    os.kill(a.pid, signal.SIGSTOP)
    ensure_sqlite_unlocked(dsn, a)
    time.sleep(2.5)  # past two leases: nobody renews attempt 1
    assert crash.store.job_rescue_expired() == [job.id]
    stop = threading.Event()

    def rescuer() -> None:
        while not stop.wait(0.1):
            with contextlib.suppress(Exception):
                crash.store.job_rescue_expired()

    sweeping = threading.Thread(target=rescuer)
    sweeping.start()
    try:
        os.kill(a.pid, signal.SIGCONT)
        # A claims attempt 2 while attempt 1's handler still runs (about 3 s more).
        assert crash.wait(job.id, timeout=30) == 2
    finally:
        stop.set()
        sweeping.join()
    final = crash.get(job.id)
    assert final.state == JobState.SUCCEEDED and final.attempts == 2, final
    trace = runs()
    assert [(n, p) for n, p, _ in trace] == [
        ("A:1", "start"),
        ("A:1", "end"),
        ("A:2", "start"),
        ("A:2", "end"),
    ]
    # Never at once: attempt 2 started after attempt 1's handler returned.
    assert trace[2][2] >= trace[1][2]
    assert kinds(crash, job.id) == ["enqueued", "claimed", "rescued", "claimed", "succeeded"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_forked_by_a_handler_dies_with_its_worker(
    crash: App, fleet: Fleet, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    job = crash.tasks["forks_a_sleeper"].enqueue(str(pid_file))
    worker = fleet.spawn("--concurrency", "1", name="A")
    child = crash.wait(job.id, timeout=30)
    assert int(pid_file.read_text()) == child and alive(child)
    worker.kill()  # SIGKILL: no clean-up of its own runs
    worker.wait(timeout=10)
    wait_until(lambda: not alive(child), 10, "the forked child ends with its worker")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, is not alive)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


# --- 3. PostgreSQL restarted -----------------------------------------------------------


def test_postgres_restart_mid_run_loses_nothing(tmp_path: Path) -> None:
    server = PgServer()
    server.start()
    workers: Fleet | None = None
    app: App | None = None
    try:
        dsn = server.dsn
        app = crash_app.build(dsn, connect_timeout=2)
        app.migrate()
        workers = Fleet(dsn, tmp_path)
        long_job = app.tasks["until_cancelled"].enqueue(60.0)
        procs = [workers.spawn("--concurrency", "4", "--lease", "3") for _ in range(2)]
        wait_until(lambda: app.get(long_job.id).state == JobState.RUNNING, 20, "long job runs")
        jobs = app.tasks["pause"].enqueue_many([((0.02, n), {}) for n in range(500)])
        wait_until(lambda: counts(app)["succeeded"] >= 100, 30, "a fifth of the jobs done")
        assert counts(app)["queued"] >= 100  # the restart comes in the middle of the run

        restart = threading.Thread(target=server.restart)
        restart.start()

        def server_down() -> bool:
            try:
                psycopg.connect(dsn, connect_timeout=1).close()
            except psycopg.OperationalError:
                return True
            return False

        try:
            wait_until(server_down, 10, "the server goes down", interval=0.005)
            down_at = time.monotonic()

            def retried(call: Callable[[], T]) -> T | None:
                try:
                    return call()
                except Exception:  # the server is away: try again
                    return None

            # Keyed: an enqueue whose answer was lost cannot create a second job.
            late = wait_until(
                lambda: retried(
                    lambda: app.tasks["pause"].options(key="during-restart").enqueue(0.0, -1)
                ),
                30,
                "an enqueue is accepted",
            )
            cancel = wait_until(
                lambda: retried(lambda: app.cancel(long_job.id)), 30, "a cancel is accepted"
            )
            accepted_after = time.monotonic() - down_at
        finally:
            restart.join()
        assert cancel.cancel_requested or cancel.state == JobState.CANCELLED

        ids = [j.id for j in jobs]

        def all_done() -> bool:
            # The workers ride out the restart: none of them exits.
            assert [p.poll() for p in procs] == [None, None], workers.logs(40)
            # A pooled connection the restart killed fails once (the pool then
            # replaces it): this test's own read is retried like any caller's.
            found = retried(lambda: app.store.job_get_many(ids))
            return found is not None and all(j.state == JobState.SUCCEEDED for j in found)

        wait_until(all_done, 60, "every job completes after the restart")
        assert app.wait(late.id, timeout=30) == -1
        wait_until(
            lambda: app.get(long_job.id).state == JobState.CANCELLED, 30, "the long job ends"
        )
        assert [p.poll() for p in procs] == [None, None], workers.logs()
        assert len(app.jobs(limit=1000)) == 502
        succeeded = Counter(
            e.job_id for e in app.store.event_since(0, 100_000) if e.kind == "succeeded"
        )
        assert all(succeeded[i] == 1 for i in [*ids, late.id])
        print(f"enqueue and cancel accepted {accepted_after:.2f}s after the server went down")
    finally:
        if workers is not None:
            workers.close()
        if app is not None:
            app.close()
        server.stop()


# --- 4. drain --------------------------------------------------------------------------


def test_sigterm_lets_the_running_job_finish(crash: App, fleet: Fleet) -> None:
    job = crash.tasks["sleepy"].enqueue(1.0)
    a = fleet.spawn("--concurrency", "1", name="A")
    wait_until(lambda: running_on(crash, job.id, a), 20, "A runs the job")
    a.send_signal(signal.SIGTERM)
    assert a.wait(timeout=15) == 0, fleet.logs()
    done = crash.get(job.id)
    assert done.state == JobState.SUCCEEDED and done.result == "A"
    assert "released" not in kinds(crash, job.id)


@pytest.mark.parametrize("how", ["stop-timeout-0", "second-sigint"])
def test_aborted_drain_releases_the_job(crash: App, fleet: Fleet, dsn: str, how: str) -> None:
    job = crash.tasks["sleepy"].enqueue(3.0)
    if how == "stop-timeout-0":
        a = fleet.spawn("--concurrency", "1", "--stop-timeout", "0", name="A")
        wait_until(lambda: running_on(crash, job.id, a), 20, "A runs the job")
        a.send_signal(signal.SIGTERM)
    else:
        a = fleet.spawn("--concurrency", "1", name="A")  # stop timeout 30 s
        wait_until(lambda: running_on(crash, job.id, a), 20, "A runs the job")
        a.send_signal(signal.SIGINT)
        time.sleep(0.3)  # draining: the job keeps running
        assert crash.get(job.id).state == JobState.RUNNING
        a.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    wait_until(lambda: crash.get(job.id).state == JobState.QUEUED, 5, "the job is released")
    released_after = time.monotonic() - signalled
    assert kinds(crash, job.id)[-1] == "released"
    assert a.wait(timeout=10) == 0, fleet.logs()
    exited_after = time.monotonic() - signalled
    # Stopped at once: A's handler did not run on to its end after the job was released.
    assert released_after < 1.0 and exited_after < 2.5, (released_after, exited_after)
    phases = crash_app.query(dsn, "SELECT name, phase FROM runs WHERE job_id = %s", (job.id,))
    assert phases == [("A", "start")]

    b = fleet.spawn("--concurrency", "1", name="B")
    assert crash.wait(job.id, timeout=20) == "B", fleet.logs()
    final = crash.get(job.id)
    assert final.attempts == 1  # the release gave its attempt back
    assert kinds(crash, job.id) == ["enqueued", "claimed", "released", "claimed", "succeeded"]
    assert b.poll() is None


# --- 5. groups -------------------------------------------------------------------------


def test_groups_run_one_at_a_time_in_order_across_processes(
    crash: App, fleet: Fleet, dsn: str
) -> None:
    procs = [fleet.spawn("--concurrency", "4") for _ in range(4)]
    for proc in procs:
        wait_until(lambda p=proc: is_registered(crash, p), 20, "workers register")
    groups = [f"g{n}" for n in range(5)]
    task = crash.tasks["in_group"]
    for seq in range(20):  # interleaved: each group's order is its own enqueue order
        for group in groups:
            task.options(group=group).enqueue(group, seq, 0.02)
    wait_until(lambda: counts(crash)["succeeded"] == 100, 60, "every grouped job runs")

    rows = crash_app.query(dsn, "SELECT grp, seq, started, ended, pid FROM group_runs")
    assert len(rows) == 100
    by_group: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for group, seq, started, ended, _pid in rows:
        by_group[group].append((seq, started, ended))
    for group, runs in by_group.items():
        runs.sort(key=lambda r: r[1])
        assert [seq for seq, _, _ in runs] == list(range(20)), group
        for (_, _, ended), (_, started, _) in itertools.pairwise(runs):
            assert started >= ended, f"{group}: two runs overlapped"
    overlapping = {
        (a, b)
        for a in groups
        for b in groups
        if a < b
        and any(s1 < e2 and s2 < e1 for _, s1, e1 in by_group[a] for _, s2, e2 in by_group[b])
    }
    assert overlapping, "groups never ran in parallel"
    assert len({pid for *_, pid in rows}) >= 2, "one process ran everything"


# --- 6. deferred and retrying jobs start on time ---------------------------------------


def test_deferred_and_retrying_jobs_start_on_time(crash: App, fleet: Fleet) -> None:
    proc = fleet.spawn("--poll-interval", "10")
    wait_until(lambda: is_registered(crash, proc), 20, "the worker registers")
    time.sleep(0.3)  # let it settle into its idle wait
    deferred = [crash.tasks["noop"].options(delay=d).enqueue() for d in (0.7, 1.9)]
    retrying = crash.tasks["fails_once"].enqueue()  # fails, retried 1 s later
    snoozing = crash.tasks["snoozes_once"].enqueue(1.4)  # snoozes 1.4 s
    for job in [*deferred, retrying, snoozing]:
        crash.wait(job.id, timeout=15)
    lateness: dict[str, float] = {}
    for name, job in [
        ("deferred 0.7s", deferred[0]),
        ("deferred 1.9s", deferred[1]),
        ("retry after 1s", retrying),
        ("snooze 1.4s", snoozing),
    ]:
        done = crash.get(job.id)
        assert done.started_at is not None
        lateness[name] = (done.started_at - done.run_at).total_seconds()
    assert crash.get(retrying.id).attempts == 2
    assert "retried" in kinds(crash, retrying.id)
    assert "snoozed" in kinds(crash, snoozing.id)
    print(", ".join(f"{name}: {late * 1000:.1f} ms late" for name, late in lateness.items()))
    assert all(0 <= late < 0.1 for late in lateness.values()), lateness
