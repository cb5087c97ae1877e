"""conveyor beside BullMQ, Celery, Dramatiq, arq and RQ, in one run, on one throwaway Redis.

    pip install -r benchmarks/requirements-peers.txt    # the Python peers (benchmark only)
    (cd benchmarks && npm ci)                           # BullMQ, as package-lock.json pins it
    python benchmarks/redis_peers.py                    # starts a throwaway redis-server
    python benchmarks/redis_peers.py --jobs 2000 --sides rq,rq-fork   # RQ's two workers
    PYTHONPATH=../other/src python benchmarks/redis_peers.py   # another checkout's conveyor

One run starts ``redis-server`` on a free loopback port with its data in a
temporary directory (``--appendonly yes``, ``appendfsync everysec``, ``--save ""``)
and stops it at the end, also on error. The sides then run one after another on
that server, with FLUSHALL between them. No-op jobs, one worker process each:

- BullMQ 5 (Node, ``bullmq_peer.mjs``): ``addBulk`` 1,000 a call, then a
  ``Worker`` of concurrency 100 that keeps completed jobs (its default).
- Celery 5: Redis broker and result backend, ``acks_late``, ``--pool threads
  --concurrency 100``, prefetch multiplier 1.
- Dramatiq 2: its ``RedisBroker``, one process of 100 threads.

- RQ 2.x: ``SimpleWorker`` (runs each job in the worker process, its best here)
  in burst mode; ``rq-fork`` is the default forking ``Worker`` (one child per
  job), whose CPU figure includes those children. Jobs are enqueued with
  ``enqueue_many`` in pipelines of 1,000.
- arq 0.28: ``max_jobs=100``, ``burst=True``, ``poll_delay`` as given
  (``--arq-poll-delay``), no logging set up.
- conveyor: ``conveyor worker --concurrency 100``, sync and async handlers, on
  ``App("redis://127.0.0.1:PORT/0")``, as ``peers.py`` runs it on PostgreSQL.
  Where this conveyor has no Redis store yet, its rows say "not available" and why.

The peers keep each job's result as they do by default, as conveyor keeps each
finished job's record. ``--peer-results drop`` (RQ's ``result_ttl=0``, arq's
``keep_result=0``) was no faster here: RQ then spends more CPU per job (it
deletes the job), arq the same within the noise. arq's ``poll_delay`` of 0.01 to
0.05 s gave the same rate here; 0.5 s (its default) about half, 0.001 s less.

All N jobs are enqueued before the worker starts. jobs/s is N over the time from
starting the worker process to the moment no job is left (counted every 20 ms);
the rate between 5% and 95% done and the worker's CPU time per job (user +
system, from /proc; "steady": between the 5% and 95% marks, start-up left out)
are measured as in ``peers.py``, whose helpers this uses.
Beside it, what each job's whole life (enqueue, claim, finish) cost redis-server,
from before the enqueue to the last job done: CPU (``INFO cpu``, user + system)
and append-only-file bytes (``INFO persistence``, ``aof_current_size``; automatic
rewrites are off on this server) per job.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers import APP, IN_FLIGHT, measure  # noqa: E402

SIDES = (
    "conveyor-sync", "conveyor-async", "bullmq", "celery", "dramatiq", "arq", "rq", "rq-fork"
)  # fmt: skip
DEFAULT_SIDES = "conveyor-sync,conveyor-async,bullmq,celery,dramatiq,arq,rq"
BATCH = 1000


@dataclass
class Row:
    name: str
    peer: str  # "conveyor" or the peer's name: what the ratios compare
    rate: float = 0.0  # worker start to all done
    rate_5_95: float = 0.0
    cpu_per_job_us: float = 0.0
    steady_cpu_us: float | None = None  # between the 5% and 95% marks: without start-up
    redis_cpu_per_job_us: float = 0.0  # each job's whole life: enqueue, run, finish
    aof_bytes_per_job: float = 0.0  # the same span
    error: str = ""


# --- the throwaway server ---------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Start redis-server on a free loopback port; yield its DSN; stop it whatever happens."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit(
            "redis-server not found on PATH: install Debian's package "
            "(`apt-get install -y redis-server`) and run again"
        )
    import redis

    with tempfile.TemporaryDirectory(prefix="redis-peers-") as tmp:
        port = free_port()
        command = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", tmp,
                   "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                   "--auto-aof-rewrite-percentage", "0", "--daemonize", "no",
                   "--logfile", str(Path(tmp) / "redis.log")]  # fmt: skip
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 20
            while True:
                if proc.poll() is not None:
                    log = Path(tmp, "redis.log")
                    raise SystemExit(
                        f"redis-server exited at start ({proc.returncode}): "
                        + (log.read_text()[-2000:] if log.exists() else "no log")
                    )
                with contextlib.suppress(redis.ConnectionError):
                    if client.ping():
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not answer on 127.0.0.1:{port} in 20 s")
                time.sleep(0.05)
            client.close()
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def flushall(dsn: str) -> None:
    import redis

    with redis.Redis.from_url(dsn) as client:
        client.flushall()


def children_cpu() -> float:
    """CPU seconds of this process's finished, waited-for children and their descendants."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_costs(dsn: str) -> tuple[float, int]:
    """redis-server's CPU seconds (INFO cpu: user + system) and its append-only file's size."""
    import redis

    with redis.Redis.from_url(dsn) as client:
        cpu = client.info("cpu")
        aof = client.info("persistence")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], int(aof["aof_current_size"])


def timed(
    dsn: str,
    row: Row,
    jobs: int,
    remaining: Callable[[], int],
    command: list[str],
    env: dict[str, str],
    with_children: bool = False,
) -> Row:
    """peers.measure, plus the time from starting the worker to the moment no job is left."""
    done_at: list[float] = []

    def watched() -> int:
        left = remaining()
        if not left and not done_at:
            done_at.append(time.perf_counter())
        return left

    before = children_cpu()
    started = time.perf_counter()
    result = measure(row.name, "redis", jobs, watched, command, env)
    row.rate = jobs / (done_at[0] - started)
    row.rate_5_95 = result.rate
    row.cpu_per_job_us = result.cpu_per_job_us
    row.steady_cpu_us = None if with_children else result.steady_cpu_us
    if with_children:  # the worker has been waited for: its forked job children count too;
        # they cannot be read between the marks, so this row has no steady figure
        row.cpu_per_job_us = (children_cpu() - before) / jobs * 1e6
    return row


# --- RQ ----------------------------------------------------------------------------------


RQ_JOBS = textwrap.dedent(
    """
    def noop():
        return None
    """
)


def rq_side(dsn: str, jobs: int, folder: Path, fork: bool, keep_results: bool) -> Row:
    import redis
    from rq import Queue

    (folder / "rq_jobs.py").write_text(RQ_JOBS)
    connection = redis.Redis.from_url(dsn)
    queue = Queue("peers", connection=connection)
    result_ttl = None if keep_results else 0  # None: RQ's default, 500 s
    for start in range(0, jobs, BATCH):
        count = min(BATCH, jobs - start)
        with connection.pipeline() as pipe:
            datas = [Queue.prepare_data("rq_jobs.noop", result_ttl=result_ttl)] * count
            queue.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
    if queue.count != jobs:
        raise SystemExit(f"RQ: {queue.count} jobs queued, {jobs} expected")
    # A job moves atomically from the queue to its intermediate list, then to
    # the started registry, and leaves that when it is finished.
    keys = (queue.key, queue.intermediate_queue_key, queue.started_job_registry.key)

    def remaining() -> int:
        with connection.pipeline(transaction=True) as pipe:
            pipe.llen(keys[0])
            pipe.llen(keys[1])
            pipe.zcard(keys[2])
            return sum(pipe.execute())

    worker_class = "rq.worker.Worker" if fork else "rq.worker.SimpleWorker"
    name = "RQ 2.12, forking Worker" if fork else "RQ 2.12, SimpleWorker"
    command = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--quiet", "--url", dsn,
               "--worker-class", worker_class, "peers"]  # fmt: skip
    try:
        env = {"PYTHONPATH": str(folder)}
        return timed(dsn, Row(name, "rq"), jobs, remaining, command, env, with_children=fork)
    finally:
        connection.close()


# --- arq ----------------------------------------------------------------------------------


ARQ_WORKER = textwrap.dedent(
    """
    import sys
    from arq import run_worker
    from arq.connections import RedisSettings

    async def noop(ctx):
        return None

    class WorkerSettings:
        functions = [noop]
        redis_settings = RedisSettings.from_dsn(sys.argv[1])
        max_jobs = int(sys.argv[2])
        poll_delay = float(sys.argv[3])
        keep_result = float(sys.argv[4])
        burst = True

    run_worker(WorkerSettings)
    """
)


def arq_side(dsn: str, jobs: int, folder: Path, poll_delay: float, keep_results: bool) -> Row:
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.constants import default_queue_name

    async def enqueue() -> None:
        pool = await create_pool(RedisSettings.from_dsn(dsn))
        for start in range(0, jobs, 200):  # arq enqueues one job per transaction
            count = min(200, jobs - start)
            await asyncio.gather(*(pool.enqueue_job("noop") for _ in range(count)))
        await pool.aclose()

    asyncio.run(enqueue())
    import redis

    connection = redis.Redis.from_url(dsn)

    def remaining() -> int:  # arq removes a job from its sorted set when it is finished
        with connection.pipeline(transaction=False) as pipe:
            pipe.zcard(default_queue_name)
            return int(pipe.execute()[0])

    if remaining() != jobs:
        raise SystemExit(f"arq: {remaining()} jobs queued, {jobs} expected")
    script = folder / "arq_worker.py"
    script.write_text(ARQ_WORKER)
    keep = "3600" if keep_results else "0"  # 3600: arq's default
    command = [sys.executable, str(script), dsn, str(IN_FLIGHT), str(poll_delay), keep]
    name = f"arq 0.28, max_jobs {IN_FLIGHT}, poll_delay {poll_delay:g}"
    try:
        return timed(dsn, Row(name, "arq"), jobs, remaining, command, {})
    finally:
        connection.close()


# --- BullMQ (Node) -------------------------------------------------------------------------


def bullmq_side(dsn: str, jobs: int) -> Row:
    """BullMQ 5 as benchmarks/package.json pins it (``npm ci`` in benchmarks/ first)."""
    import redis

    row = Row(f"BullMQ 5 (Node), concurrency {IN_FLIGHT}", "bullmq")
    node = shutil.which("node")
    if node is None or not (HERE / "node_modules" / "bullmq").is_dir():
        row.error = "not available: needs node, and `npm ci` in benchmarks/"
        return row
    script = str(HERE / "bullmq_peer.mjs")
    subprocess.run([node, script, "add", dsn, str(jobs)], check=True)
    connection = redis.Redis.from_url(dsn)

    def remaining() -> int:  # waiting (plain or by priority), and taken but not finished
        with connection.pipeline(transaction=False) as pipe:
            pipe.llen("bull:peers:wait")
            pipe.zcard("bull:peers:prioritized")
            pipe.llen("bull:peers:active")
            return sum(int(n) for n in pipe.execute())

    if remaining() != jobs:
        raise SystemExit(f"BullMQ: {remaining()} jobs queued, {jobs} expected")
    try:
        return timed(dsn, row, jobs, remaining, [node, script, "work", dsn, str(IN_FLIGHT)], {})
    finally:
        connection.close()


# --- Celery ---------------------------------------------------------------------------------


CELERY_APP = textwrap.dedent(
    """
    import os
    from celery import Celery

    app = Celery("celery_peer", broker=os.environ["PEER_DSN"], backend=os.environ["PEER_DSN"])
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                    task_default_queue="peers", worker_hijack_root_logger=False)

    @app.task
    def noop():
        return None
    """
)


def quiet(command: list[str]) -> list[str]:
    """The command with its output (banners, a log line per start and stop) sent nowhere;
    exec keeps its pid, whose CPU time is read."""
    return ["sh", "-c", 'exec "$0" "$@" >/dev/null 2>&1', *command]


def celery_side(dsn: str, jobs: int, folder: Path) -> Row:
    """Celery 5: Redis broker and result backend, acks_late, a pool of 100 threads."""
    import redis

    (folder / "celery_peer.py").write_text(CELERY_APP)
    env = {"PEER_DSN": dsn, "PYTHONPATH": str(folder)}
    os.environ.update(env)
    sys.path.insert(0, str(folder))
    import celery_peer  # type: ignore[import-not-found]

    for _ in range(jobs):
        celery_peer.noop.apply_async()
    connection = redis.Redis.from_url(dsn)

    def remaining() -> int:  # the queue's list, and those delivered but not acknowledged
        with connection.pipeline(transaction=False) as pipe:
            pipe.llen("peers")
            pipe.hlen("unacked")
            return sum(int(n) for n in pipe.execute())

    command = [sys.executable, "-m", "celery", "-A", "celery_peer", "worker", "--pool",
               "threads", "--concurrency", str(IN_FLIGHT), "--queues", "peers",
               "--loglevel", "WARNING", "--without-heartbeat", "--without-gossip",
               "--without-mingle"]  # fmt: skip
    row = Row(f"Celery 5.5, threads {IN_FLIGHT}, acks_late", "celery")
    try:
        return timed(dsn, row, jobs, remaining, quiet(command), env)
    finally:
        connection.close()


# --- Dramatiq -------------------------------------------------------------------------------


DRAMATIQ_APP = textwrap.dedent(
    """
    import os
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    dramatiq.set_broker(RedisBroker(url=os.environ["PEER_DSN"]))

    @dramatiq.actor(queue_name="peers", max_retries=0)
    def noop():
        return None
    """
)


def dramatiq_side(dsn: str, jobs: int, folder: Path) -> Row:
    """Dramatiq 2: its Redis broker, one process of 100 threads."""
    import redis

    (folder / "dramatiq_peer.py").write_text(DRAMATIQ_APP)
    env = {"PEER_DSN": dsn, "PYTHONPATH": str(folder)}
    os.environ.update(env)
    sys.path.insert(0, str(folder))
    import dramatiq_peer  # type: ignore[import-not-found]

    for _ in range(jobs):
        dramatiq_peer.noop.send()
    connection = redis.Redis.from_url(dsn)

    def remaining() -> int:  # a message's body stays in .msgs until it is acknowledged
        return int(connection.hlen("dramatiq:peers.msgs"))

    command = [sys.executable, "-m", "dramatiq", "dramatiq_peer", "--processes", "1",
               "--threads", str(IN_FLIGHT), "--queues", "peers"]  # fmt: skip
    row = Row(f"Dramatiq 2, {IN_FLIGHT} threads", "dramatiq")
    try:  # its worker is a child process: counted once waited for, with no steady figure
        return timed(dsn, row, jobs, remaining, quiet(command), env, with_children=True)
    finally:
        connection.close()


# --- conveyor -------------------------------------------------------------------------------


def conveyor_left(dsn: str, queue: str) -> Callable[[], int]:
    """Jobs of ``queue`` not finished, from ``stats()``: its counters, in one round trip.

    Not peers.conveyor_remaining: ``count_jobs`` on Redis walks the job indexes
    from Python (0.3-0.6 s at 20,000 jobs), which would stretch the 20 ms
    sampling and let a stale count outlive the worker's exit.
    """
    from conveyor import App

    app = App(dsn)

    def remaining() -> int:
        stats = app.stats()
        return stats.count("queued", queue) + stats.count("running", queue)

    return remaining


def conveyor_side(dsn: str, jobs: int, folder: Path, kind: str) -> Row:
    """As peers.conveyor_run, but keeping PYTHONPATH, so a conveyor checkout given there is used."""
    from conveyor import App
    from conveyor.errors import ConveyorError
    from conveyor.task import EnqueueOptions

    row = Row(f"conveyor {kind}, concurrency {IN_FLIGHT}", "conveyor")
    task, queue = ("noop", "peers") if kind == "sync" else ("anoop", "peers_async")
    try:
        with App(dsn) as app:
            app.migrate()
            for start in range(0, jobs, BATCH):
                calls: list[tuple[tuple[()], dict[str, object]]] = [((), {})]
                calls *= min(BATCH, jobs - start)
                app.enqueue_calls(task, calls, EnqueueOptions(queue=queue))
        remaining = conveyor_left(dsn, queue)
    except ConveyorError as exc:
        row.error = f"not available: {type(exc).__name__}: {exc}"
        return row
    (folder / "peers_app.py").write_text(APP)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "conveyor", "worker", "peers_app:app",
               "--queues", queue, "--burst", "--concurrency", str(IN_FLIGHT),
               "--log-level", "WARNING"]  # fmt: skip
    try:
        return timed(dsn, row, jobs, remaining, command, {"CONVEYOR_DSN": dsn, "PYTHONPATH": path})
    except SystemExit as exc:  # the worker failed: say so in its row, keep the peers' figures
        row.error = f"failed: {exc}"
        return row


# --- the table ----------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    bullmq = next((r for r in rows if r.peer == "bullmq" and not r.error), None)
    print()
    print("| side | jobs/s | jobs/s 5-95% | worker CPU per job (µs) | steady (µs) | "
          "Redis CPU per job (µs) | AOF bytes per job | jobs/s vs BullMQ |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.error:
            print(f"| {r.name} | {r.error} | | | | | | |")
            continue
        steady = "" if r.steady_cpu_us is None else f"{r.steady_cpu_us:.0f}"
        versus = f"{r.rate / bullmq.rate:.2f}x" if bullmq and r is not bullmq else ""
        print(f"| {r.name} | {r.rate:,.0f} | {r.rate_5_95:,.0f} | {r.cpu_per_job_us:.0f} "
              f"| {steady} | {r.redis_cpu_per_job_us:.0f} | {r.aof_bytes_per_job:,.0f} "
              f"| {versus} |")  # fmt: skip


def stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the finally blocks: workers and redis-server are stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument(
        "--sides",
        default=DEFAULT_SIDES,
        help=f"comma-separated, in order, from {', '.join(SIDES)} (default {DEFAULT_SIDES})",
    )
    parser.add_argument("--arq-poll-delay", type=float, default=0.05, metavar="SECONDS")
    parser.add_argument("--peer-results", choices=["keep", "drop"], default="keep")
    args = parser.parse_args()
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides:
        parser.error(f"unknown side(s) {', '.join(unknown) or '(none)'}: use {', '.join(SIDES)}")
    if args.jobs < 20:
        parser.error("--jobs must be at least 20")
    keep = args.peer_results == "keep"
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, redis_server() as dsn:
        folder = Path(tmp)
        for side in sides:
            flushall(dsn)
            cpu, aof = server_costs(dsn)  # from before the enqueue: each job's whole life
            if side in ("rq", "rq-fork"):
                row = rq_side(dsn, args.jobs, folder, side == "rq-fork", keep)
            elif side == "arq":
                row = arq_side(dsn, args.jobs, folder, args.arq_poll_delay, keep)
            elif side == "bullmq":
                row = bullmq_side(dsn, args.jobs)
            elif side == "celery":
                row = celery_side(dsn, args.jobs, folder)
            elif side == "dramatiq":
                row = dramatiq_side(dsn, args.jobs, folder)
            else:
                row = conveyor_side(dsn, args.jobs, folder, side.split("-")[1])
            cpu_after, aof_after = server_costs(dsn)
            row.redis_cpu_per_job_us = (cpu_after - cpu) / args.jobs * 1e6
            row.aof_bytes_per_job = (aof_after - aof) / args.jobs
            rows.append(row)
            print(f"{row.name}: {row.error or f'{row.rate:,.0f} jobs/s'}", flush=True)
    print_table(rows)


if __name__ == "__main__":
    main()
