"""conveyor beside the Python peers, in one run, on the same databases: speed and cost.

    pip install -r benchmarks/requirements-peers.txt   # PgQueuer, Procrastinate, Huey
    python benchmarks/peers.py                         # starts a throwaway PostgreSQL
    python benchmarks/peers.py --jobs 50000 --backend postgres --pg-dsn postgresql://u@host/db

No-op jobs (10,000 unless ``--jobs``), one worker process each, at most 100 jobs
in flight on every side, every side on the same server in the same run:

- PostgreSQL: conveyor (``conveyor worker --concurrency 100``, sync and async
  handlers), PgQueuer (``QueueManager.run(batch_size=100)``, asyncpg),
  Procrastinate (``run_worker(concurrency=100)``, an async handler, finished
  jobs kept as it does by default), and the floor of a lease queue in raw SQL
  (raw_lease.py: claim 100 with SKIP LOCKED, finish by id and lease token), once
  without events and once with one event row per attempt's end.
- SQLite (WAL, one file): conveyor (sync and async) beside Huey
  (``SqliteHuey``, a consumer of 4 threads, its best here).

Every side runs the same way: its tables are made, N jobs are enqueued by this
process, one worker process starts, and this process counts the jobs left every
20 ms. The rate is taken between the moments 5% and 95% of the jobs are done,
so start-up and the last stragglers weigh the same for everyone. The worker
process's CPU time (user + system, from /proc) over the whole run, divided by N,
is its cost per job; "steady" is the CPU time between the 5% and 95% marks
divided by the jobs done between them (start-up, imports and connecting left out).

On PostgreSQL each side also gets what the database paid over each job's whole
life, enqueue, claim and finish (pg_cost.py). A CHECKPOINT is taken before each
side, so that full-page images weigh the same for every side (the throwaway
server runs with full_page_writes off: there are none there). From just before
the enqueue to the moment the worker and its sessions are gone, the WAL written
(``pg_current_wal_lsn()`` before and after) and the server's CPU time (user +
system of the postmaster and every process below it, ended ones included, from
/proc) are each divided by N. The counting every 20 ms is inside every window.
A VACUUM after each side, outside the windows, keeps one side's dead rows from
being cleaned in another's window, so the figures leave that cleaning out. When
the WAL files are readable here, pg_waldump sums each window's WAL by relation
and record kind, printed after the tables: where the bytes of a job go.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # pg_server, for pg.py and pg_waldump

import raw_lease  # noqa: E402
from conveyor.worker.worker import WorkerOptions  # noqa: E402
from pg import postgres  # noqa: E402
from pg_cost import Cost, Window  # noqa: E402

IN_FLIGHT = 100
DEFAULT_CONCURRENCY = WorkerOptions.concurrency  # the dataclass default


@dataclass
class Result:
    name: str
    backend: str
    rate: float
    cpu_per_job_us: float
    #: CPU per job between the 5% and 95% marks: the work itself, without start-up.
    steady_cpu_us: float
    jobs: int = 0
    #: What the database paid (PostgreSQL only).
    cost: Cost | None = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(
    name: str,
    backend: str,
    jobs: int,
    remaining: Callable[[], int],
    command: list[str],
    env: dict[str, str] | None = None,
) -> Result:
    """Run the worker command; time 5% to 95% of the jobs done; its CPU per job."""
    proc = subprocess.Popen(command, env={**os.environ, **(env or {})})
    marks: dict[str, float] = {}
    cpu = 0.0
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            left = remaining()
            done = jobs - left
            now = time.perf_counter()
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                cpu = cpu_seconds(proc.pid)
            if "start" not in marks and done >= jobs * 0.05:
                marks["start"], marks["start_done"], marks["start_cpu"] = now, done, cpu
            if done >= jobs * 0.95:
                marks["end"], marks["end_done"], marks["end_cpu"] = now, done, cpu
                break
            if proc.poll() is not None and left:
                raise SystemExit(f"{name}: the worker exited with {left} jobs left")
            time.sleep(0.02)
        else:
            raise SystemExit(f"{name}: not done in 600 s")
        while left := remaining():  # the rest, for the CPU figure
            try:
                cpu = cpu_seconds(proc.pid)
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.02)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            cpu = cpu_seconds(proc.pid)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)
    steady_jobs = marks["end_done"] - marks["start_done"]
    if not steady_jobs or marks["end"] == marks["start"]:
        raise SystemExit(f"{name}: 5% to 95% of the jobs went by in one count: give more --jobs")
    rate = steady_jobs / (marks["end"] - marks["start"])
    steady_cpu = (marks["end_cpu"] - marks["start_cpu"]) / steady_jobs
    return Result(name, backend, rate, cpu / jobs * 1e6, steady_cpu * 1e6)


# --- a PostgreSQL side: enqueue and drain inside one cost window ---------------------


def pg_side(
    name: str,
    dsn: str,
    jobs: int,
    window: Window,
    enqueue: Callable[[], None],
    count_sql: str,
    command: list[str],
    env: dict[str, str] | None = None,
) -> Result:
    """Enqueue and drain ``jobs`` with the side's tables already made; its cost."""
    window.begin()
    enqueue()
    with psycopg.connect(dsn, autocommit=True) as counter:

        def remaining() -> int:
            row = counter.execute(count_sql).fetchone()
            return int(row[0]) if row else 0

        result = measure(name, "postgres", jobs, remaining, command, env)
    result.cost = window.end()
    return result


# --- conveyor ---------------------------------------------------------------------


APP = textwrap.dedent(
    """
    from conveyor import App

    app = App()

    @app.task(queue="peers")
    def noop() -> None:
        return None

    @app.task(queue="peers_async")
    async def anoop() -> None:
        return None
    """
)


def conveyor_command(queue: str, concurrency: int, prefetch: int = 0) -> list[str]:
    command = [sys.executable, "-m", "conveyor", "worker", "peers_app:app", "--queues", queue,
               "--burst", "--log-level", "WARNING", "--concurrency", str(concurrency)]  # fmt: skip
    return command + (["--prefetch", str(prefetch)] if prefetch else [])


def conveyor_enqueue(dsn: str, jobs: int, task: str, queue: str) -> None:
    from conveyor import App
    from conveyor.task import EnqueueOptions

    with App(dsn) as app:
        for start in range(0, jobs, 1000):
            calls = [((), {})] * min(1000, jobs - start)
            app.enqueue_calls(task, calls, EnqueueOptions(queue=queue))


def conveyor_side(
    dsn: str,
    jobs: int,
    kind: str,
    concurrency: int,
    folder: Path,
    window: Window | None,
    prefetch: int = 0,
) -> Result:
    """One conveyor worker process on PostgreSQL (with ``window``) or SQLite."""
    from conveyor import App

    (folder / "peers_app.py").write_text(APP)
    task, queue = ("noop", "peers") if kind == "sync" else ("anoop", "peers_async")
    with App(dsn) as app:
        app.migrate()
    label = f"conveyor {kind}, concurrency {concurrency}"
    label += f", prefetch {prefetch}" if prefetch else ""
    command = conveyor_command(queue, concurrency, prefetch)
    env = {"CONVEYOR_DSN": dsn, "PYTHONPATH": python_path(folder)}
    if window is not None:
        count = (
            f"SELECT count(*) FROM jobs WHERE queue = '{queue}' AND state IN ('queued', 'running')"
        )
        enqueue = lambda: conveyor_enqueue(dsn, jobs, task, queue)  # noqa: E731
        return pg_side(label, dsn, jobs, window, enqueue, count, command, env)
    conveyor_enqueue(dsn, jobs, task, queue)
    with App(dsn) as counter:

        def remaining() -> int:
            counts = counter.count_jobs(queue=queue)
            return sum(counts.get(s, 0) for s in ("ready", "scheduled", "retrying", "running"))

        return measure(label, "sqlite", jobs, remaining, command, env)


# --- PgQueuer ---------------------------------------------------------------------------


PGQ_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    async def main(dsn):
        conn = await asyncpg.connect(dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job):
            return None

        await qm.run(batch_size=100, mode=QueueExecutionMode.drain)

    asyncio.run(main(sys.argv[1]))
    """
)


def pgqueuer_side(dsn: str, jobs: int, folder: Path, window: Window) -> Result:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def install() -> None:
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        with contextlib.suppress(Exception):
            await queries.uninstall()
        await queries.install()
        await conn.close()

    async def enqueue() -> None:
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        await conn.close()

    asyncio.run(install())
    script = folder / "pgq_worker.py"
    script.write_text(PGQ_WORKER)
    label = f"PgQueuer {version('pgqueuer')}, batch 100"
    return pg_side(label, dsn, jobs, window, lambda: asyncio.run(enqueue()),
                   "SELECT count(*) FROM pgqueuer", [sys.executable, str(script), dsn])  # fmt: skip


# --- Procrastinate ------------------------------------------------------------------------


PROCRASTINATE_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=sys.argv[1]))

    @app.task(name="noop", queue="peers")
    async def noop():
        return None

    async def main():
        async with app.open_async():
            await app.run_worker_async(queues=["peers"], concurrency=100, wait=False,
                                       install_signal_handlers=False)

    asyncio.run(main())
    """
)


def procrastinate_side(dsn: str, jobs: int, folder: Path, window: Window) -> Result:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def install() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def enqueue() -> None:
        task = app.configure_task("noop", queue="peers")
        async with app.open_async():
            for start in range(0, jobs, 1000):
                await task.batch_defer_async(*[{}] * min(1000, jobs - start))

    asyncio.run(install())
    script = folder / "procrastinate_worker.py"
    script.write_text(PROCRASTINATE_WORKER)
    label = f"Procrastinate {version('procrastinate')}, concurrency 100"
    count = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    return pg_side(label, dsn, jobs, window, lambda: asyncio.run(enqueue()), count,
                   [sys.executable, str(script), dsn])  # fmt: skip


# --- the floor: a lease queue in raw SQL ----------------------------------------------------


def raw_side(dsn: str, jobs: int, window: Window, events: bool) -> Result:
    raw_lease.prepare(dsn)
    label = "raw SQL lease queue, claim 100" + (", an event per attempt" if events else "")
    command = [sys.executable, str(HERE / "raw_lease.py"), dsn, "events" if events else "plain"]
    return pg_side(label, dsn, jobs, window, lambda: raw_lease.enqueue(dsn, jobs),
                   raw_lease.remaining_sql(), command)  # fmt: skip


# --- Huey ---------------------------------------------------------------------------


HUEY_APP = textwrap.dedent(
    """
    import os
    from huey import SqliteHuey

    huey = SqliteHuey(filename=os.environ["HUEY_FILE"], results=False)

    @huey.task()
    def noop():
        return None
    """
)


def huey_side(jobs: int, folder: Path) -> Result:
    path = folder / "huey.db"
    (folder / "huey_app.py").write_text(HUEY_APP)
    env = {"HUEY_FILE": str(path), "PYTHONPATH": python_path(folder)}
    os.environ.update(env)
    sys.path.insert(0, str(folder))
    import huey_app

    for _ in range(jobs):
        huey_app.noop()
    reader = sqlite3.connect(path)

    def remaining() -> int:
        row = reader.execute("SELECT count(*) FROM task").fetchone()
        return int(row[0]) if row else 0

    command = [sys.executable, "-m", "huey.bin.huey_consumer", "huey_app.huey",
               "-w", "4", "-k", "thread", "-q"]  # fmt: skip
    try:
        label = f"Huey {version('huey')}, 4 threads"
        return measure(label, "sqlite", jobs, remaining, command, env)
    finally:
        reader.close()


# --- the tables ----------------------------------------------------------------------------


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}x" if ours is not None and theirs else "-"


def print_postgres(rows: list[Result]) -> None:
    print("PostgreSQL, per job over its whole life (enqueue, claim, finish):")
    print()
    print("| side | jobs/s | worker CPU µs/job (whole / steady) | WAL B/job | server CPU µs/job |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        wal = f"{r.cost.wal_bytes / r.jobs:,.0f}" if r.cost else "-"
        cpu = r.cost.server_cpu if r.cost else None
        server = f"{cpu / r.jobs * 1e6:,.0f}" if cpu is not None else "-"
        worker = f"{r.cpu_per_job_us:.0f} / {r.steady_cpu_us:.0f}"
        print(f"| {r.name} | {r.rate:,.0f} | {worker} | {wal} | {server} |")
    peer = next((r for r in rows if r.name.startswith("PgQueuer")), None)
    ours = [r for r in rows if r.name.startswith("conveyor")]
    if peer is None or peer.cost is None or not ours:
        return
    print()
    print("| conveyor / PgQueuer | jobs/s | WAL | server CPU |")
    print("|---|---:|---:|---:|")
    for r in ours:
        assert r.cost is not None
        wal = ratio(r.cost.wal_bytes, peer.cost.wal_bytes)
        cpu = ratio(r.cost.server_cpu, peer.cost.server_cpu)
        print(f"| {r.name} | {ratio(r.rate, peer.rate)} | {wal} | {cpu} |")


def print_breakdown(r: Result, smallest: float = 1.0) -> None:
    """Where a side's WAL went: bytes per job by relation and record kind (pg_waldump)."""
    if r.cost is None or not r.cost.records:
        return
    records = r.cost.records
    total = sum(size for _, size in records.values())
    print()
    print(f"WAL of {r.name}: {r.cost.wal_bytes / r.jobs:,.0f} B/job ({r.cost.start_lsn} to "
          f"{r.cost.end_lsn}), {total / r.jobs:,.0f} B/job in records:")  # fmt: skip
    print()
    print("| relation | record | records/job | B/job |")
    print("|---|---|---:|---:|")
    rest = [0, 0]
    for (relation, kind), (n, size) in sorted(records.items(), key=lambda kv: -kv[1][1]):
        if size / r.jobs < smallest:
            rest[0] += n
            rest[1] += size
            continue
        print(f"| {relation} | {kind} | {n / r.jobs:.2f} | {size / r.jobs:,.1f} |")
    if rest[0]:
        print(f"| (the rest) | | {rest[0] / r.jobs:.2f} | {rest[1] / r.jobs:,.1f} |")
    padding = r.cost.wal_bytes - total
    print(f"| (page headers, alignment) | | | {padding / r.jobs:,.1f} |")


def print_sqlite(rows: list[Result]) -> None:
    print("SQLite:")
    print()
    print("| side | jobs/s | vs Huey | worker CPU µs/job (whole / steady) |")
    print("|---|---:|---:|---:|")
    peer = next((r for r in rows if r.name.startswith("Huey")), None)
    for r in rows:
        vs = "" if r is peer or peer is None else ratio(r.rate, peer.rate)
        worker = f"{r.cpu_per_job_us:.0f} / {r.steady_cpu_us:.0f}"
        print(f"| {r.name} | {r.rate:,.0f} | {vs} | {worker} |")


def python_path(folder: Path) -> str:
    """The worker's PYTHONPATH: its app's folder, then the caller's own (so that
    ``PYTHONPATH=../other/src`` measures another checkout's conveyor)."""
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)


def run_postgres(
    dsn: str, jobs: int, folder: Path, extra: list[int], prefetch: int
) -> list[Result]:
    window = Window(dsn)
    try:
        results = [pgqueuer_side(dsn, jobs, folder, window)]
        for kind in ("sync", "async"):
            results.append(conveyor_side(dsn, jobs, kind, IN_FLIGHT, folder, window))
        results.append(procrastinate_side(dsn, jobs, folder, window))
        results.append(raw_side(dsn, jobs, window, events=False))
        results.append(raw_side(dsn, jobs, window, events=True))
        for concurrency in extra:
            results.append(conveyor_side(dsn, jobs, "sync", concurrency, folder, window))
        if prefetch:
            concurrency = DEFAULT_CONCURRENCY
            results.append(conveyor_side(dsn, jobs, "sync", concurrency, folder, window, prefetch))
    finally:
        window.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--pg-dsn", help="use this PostgreSQL database (it gets tables)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument(
        "--concurrency",
        default="",
        help="more PostgreSQL runs of conveyor (sync) at these concurrencies, e.g. 16,32",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="a PostgreSQL run of conveyor (sync) at its default concurrency with this prefetch",
    )
    args = parser.parse_args()
    if args.jobs < 100:
        raise SystemExit(f"--jobs {args.jobs}: give at least 100 jobs, so that 5% is a job")
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.backend in ("postgres", "all"):
            extra = [int(c) for c in args.concurrency.split(",") if c.strip()]
            with postgres(args.pg_dsn) as dsn:
                results += run_postgres(dsn, args.jobs, folder, extra, args.prefetch)
        if args.backend in ("sqlite", "all"):
            results.append(huey_side(args.jobs, folder))
            for kind in ("sync", "async"):
                dsn = f"sqlite:///{folder / f'conveyor-{kind}.db'}"
                results.append(conveyor_side(dsn, args.jobs, kind, IN_FLIGHT, folder, None))
    for r in results:
        r.jobs = args.jobs
    postgres_rows = [r for r in results if r.backend == "postgres"]
    sqlite_rows = [r for r in results if r.backend == "sqlite"]
    print()
    if postgres_rows:
        print_postgres(postgres_rows)
        for r in postgres_rows:
            print_breakdown(r)
        print()
    if sqlite_rows:
        print_sqlite(sqlite_rows)


if __name__ == "__main__":
    main()
