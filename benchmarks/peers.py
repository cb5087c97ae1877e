"""conveyor beside the Python peers, in one run, on the same databases.

    pip install -r benchmarks/requirements-peers.txt     # PgQueuer, Huey (benchmark only)
    python benchmarks/peers.py                           # starts a throwaway PostgreSQL
    python benchmarks/peers.py --jobs 50000 --pg-dsn postgresql://user@host/db

No-op jobs, one worker process each, at most 100 jobs in flight on every side:

- PostgreSQL: conveyor (``conveyor worker --concurrency 100``, sync and async
  handlers, at the worker's default concurrency, and at the default
  concurrency with ``--prefetch`` making up the 100 in hand) beside PgQueuer
  (``QueueManager.run(batch_size=100)``, asyncpg, its best here).
- SQLite (WAL, one file): conveyor (sync and async) beside Huey
  (``SqliteHuey``, a consumer of 4 threads, its best here).

Every side runs the same way: N jobs are enqueued, one worker process starts,
and this process counts the jobs left every 20 ms. The rate is taken between
the moments 5% and 95% of the jobs are done, so start-up and the last stragglers
weigh the same for everyone. The worker process's CPU time (user + system, from
/proc) over the whole run, divided by N, is its cost per job; "steady" is the
CPU time between the 5% and 95% marks divided by the jobs done between them
(start-up, imports and connecting left out).
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conveyor.worker.worker import WorkerOptions  # noqa: E402
from pg import postgres  # noqa: E402

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
    rate = steady_jobs / (marks["end"] - marks["start"])
    steady_cpu = (marks["end_cpu"] - marks["start_cpu"]) / steady_jobs
    return Result(name, backend, rate, cpu / jobs * 1e6, steady_cpu * 1e6)


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


def conveyor_remaining(dsn: str, queue: str) -> Callable[[], int]:
    from conveyor import App

    app = App(dsn)

    def remaining() -> int:
        counts = app.count_jobs(queue=queue)
        return sum(counts.get(s, 0) for s in ("ready", "scheduled", "retrying", "running"))

    return remaining


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


def pgqueuer_side(dsn: str, jobs: int, folder: Path) -> Result:
    import asyncio

    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    async def prepare() -> None:
        conn = await asyncpg.connect(dsn)
        queries = Queries(AsyncpgDriver(conn))
        with contextlib.suppress(Exception):
            await queries.uninstall()
        await queries.install()
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
        await conn.close()

    asyncio.run(prepare())
    script = folder / "pgq_worker.py"
    script.write_text(PGQ_WORKER)
    import psycopg

    counter = psycopg.connect(dsn, autocommit=True)

    def remaining() -> int:
        row = counter.execute("SELECT count(*) FROM pgqueuer").fetchone()
        return int(row[0]) if row else 0

    try:
        return measure("PgQueuer 1.6, batch 100", "postgres", jobs, remaining,
                       [sys.executable, str(script), dsn])  # fmt: skip
    finally:
        counter.close()


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
    env = {"HUEY_FILE": str(path), "PYTHONPATH": str(folder)}
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
        return measure("Huey 3.5, 4 threads", "sqlite", jobs, remaining, command, env)
    finally:
        reader.close()


# --- the table ----------------------------------------------------------------------------


def conveyor_run(
    dsn: str,
    backend: str,
    jobs: int,
    kind: str,
    concurrency: int | None,
    folder: Path,
    prefetch: int = 0,
) -> Result:
    """One conveyor worker process; ``concurrency`` None runs it at its default."""
    from conveyor import App
    from conveyor.task import EnqueueOptions

    (folder / "peers_app.py").write_text(APP)
    task, queue = ("noop", "peers") if kind == "sync" else ("anoop", "peers_async")
    with App(dsn) as app:
        app.migrate()
        for start in range(0, jobs, 1000):
            calls = [((), {})] * min(1000, jobs - start)
            app.enqueue_calls(task, calls, EnqueueOptions(queue=queue))
    remaining = conveyor_remaining(dsn, queue)
    command = [sys.executable, "-m", "conveyor", "worker", "peers_app:app",
               "--queues", queue, "--burst", "--log-level", "WARNING"]  # fmt: skip
    if concurrency is None:
        label = f"conveyor {kind}, default concurrency ({DEFAULT_CONCURRENCY})"
    else:
        command += ["--concurrency", str(concurrency)]
        label = f"conveyor {kind}, concurrency {concurrency}"
    if prefetch:
        command += ["--prefetch", str(prefetch)]
        label += f", prefetch {prefetch}"
    env = {"CONVEYOR_DSN": dsn, "PYTHONPATH": str(folder)}
    return measure(label, backend, jobs, remaining, command, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
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
        default=IN_FLIGHT - DEFAULT_CONCURRENCY,
        help="a PostgreSQL run at the default concurrency with this prefetch (0: none)",
    )
    args = parser.parse_args()
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if args.backend in ("postgres", "all"):
            with postgres(args.pg_dsn) as dsn:
                results.append(pgqueuer_side(dsn, args.jobs, folder))
                extra = [int(c) for c in args.concurrency.split(",") if c.strip()]
                runs: list[tuple[str, int | None]] = [
                    ("sync", IN_FLIGHT), ("async", IN_FLIGHT), ("sync", None), ("async", None),
                    *(("sync", c) for c in extra),
                ]  # fmt: skip
                for kind, concurrency in runs:
                    results.append(
                        conveyor_run(dsn, "postgres", args.jobs, kind, concurrency, folder)
                    )
                if args.prefetch:
                    results.append(conveyor_run(dsn, "postgres", args.jobs, "sync", None,
                                                folder, args.prefetch))  # fmt: skip
        if args.backend in ("sqlite", "all"):
            results.append(huey_side(args.jobs, folder))
            for kind in ("sync", "async"):
                dsn = f"sqlite:///{folder / f'conveyor-{kind}.db'}"
                results.append(conveyor_run(dsn, "sqlite", args.jobs, kind, IN_FLIGHT, folder))
    print()
    print("| backend | side | jobs/s | vs peer | worker CPU per job (µs): whole run / steady |")
    print("|---|---|---:|---:|---:|")
    for backend in ("postgres", "sqlite"):
        rows = [r for r in results if r.backend == backend]
        if not rows:
            continue
        peer = rows[0]
        for r in rows:
            ratio = "" if r is peer else f"{r.rate / peer.rate:.2f}x"
            cpu = f"{r.cpu_per_job_us:.0f} / {r.steady_cpu_us:.0f}"
            print(f"| {backend} | {r.name} | {r.rate:,.0f} | {ratio} | {cpu} |")


if __name__ == "__main__":
    main()
