"""End-to-end throughput and wake latency of a worker, beside the raw SQL loop.

    python benchmarks/throughput.py                    # every backend (starts PostgreSQL, Redis)
    python benchmarks/throughput.py --backend sqlite --jobs 50000

Throughput: N no-op jobs are enqueued, then one worker process
(``conveyor worker --burst --concurrency 16``) runs them all; the rate is N over
the span from the first claim to the last finish, read from the store. Beside
it, the raw loop of benchmarks/store.py claims 16 and completes them, in this
process, on the same database.

Latency: with an idle worker (fallback poll 10 s, so only wakeups count), jobs
are enqueued one at a time and each handler returns the time it started; the
latency is start minus the moment before the enqueue call. Measured with the
worker in another process and in this process. Beside it, the raw signal:
LISTEN/NOTIFY round trip on PostgreSQL, data_version change detection on SQLite,
PUBLISH to a subscriber on Redis (whose raw loop is benchmarks/raw_redis.lua).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conveyor import App  # noqa: E402
from conveyor.store.sqlite.watcher import DEFAULT_INTERVAL  # noqa: E402
from conveyor.task import EnqueueOptions  # noqa: E402
from pg import postgres  # noqa: E402
from redis_db import redis_database  # noqa: E402
from store import raw_loop  # noqa: E402

CONCURRENCY = 16


def worker_process(dsn: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CONVEYOR_DSN": dsn, "PYTHONPATH": str(HERE)}
    command = [
        sys.executable,
        "-m",
        "conveyor",
        "worker",
        "bench_app:app",
        "--log-level",
        "WARNING",
    ]
    return subprocess.Popen([*command, *extra], env=env)


def throughput(dsn: str, backend: str, jobs: int) -> tuple[float, float]:
    with App(dsn) as app:
        app.migrate()
        for start in range(0, jobs, 1000):
            calls = [((), {})] * min(1000, jobs - start)
            app.enqueue_calls("noop", calls, EnqueueOptions(queue="bench"))
        proc = worker_process(
            dsn, "--queues", "bench", "--burst", "--concurrency", str(CONCURRENCY)
        )
        if proc.wait(timeout=600) != 0:
            raise SystemExit("the benchmark worker failed")
        done = app.jobs(state="succeeded", queue="bench", limit=jobs)
        assert len(done) == jobs, f"{len(done)} of {jobs} jobs succeeded"
        first = min(j.started_at for j in done if j.started_at)
        last = max(j.finished_at for j in done if j.finished_at)
        ours = jobs / (last - first).total_seconds()
    raw = raw_loop(backend, dsn)
    try:
        raw.enqueue(jobs)
        started = time.perf_counter()
        count = raw.drain(CONCURRENCY)
        theirs = count / (time.perf_counter() - started)
    finally:
        raw.close()
    return ours, theirs


def latencies(app: App, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        before = time.time()
        (job,) = app.enqueue_calls("started", [((), {})], EnqueueOptions(queue="latency"))
        began = job.wait(timeout=10)
        out.append(began - before)
        time.sleep(0.01)
    return out


def latency_other_process(dsn: str, samples: int) -> list[float]:
    proc = worker_process(dsn, "--queues", "latency", "--poll-interval", "10", "--concurrency", "4")
    try:
        with App(dsn) as app:
            latencies(app, 5)  # the worker is up and warm
            return latencies(app, samples)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def latency_same_process(dsn: str, samples: int) -> list[float]:
    sys.path.insert(0, str(HERE))
    os.environ["CONVEYOR_DSN"] = dsn
    import bench_app

    # A fresh App per backend: the module's App was made for the DSN of its first import.
    app = importlib.reload(bench_app).app
    try:
        with app.worker(queues=["latency"], concurrency=4, poll_interval=10):
            latencies(app, 5)
            return latencies(app, samples)
    finally:
        app.close()


def raw_signal_latency(backend: str, dsn: str, samples: int) -> list[float]:
    """The floor: how fast the database's own signal crosses processes."""
    out: list[float] = []
    if backend == "postgres":
        import psycopg

        listener = psycopg.connect(dsn, autocommit=True)
        sender = psycopg.connect(dsn, autocommit=True)
        listener.execute("LISTEN bench_raw")
        for _ in range(samples):
            before = time.time()
            sender.execute("NOTIFY bench_raw")
            next(listener.notifies(timeout=5, stop_after=1))
            out.append(time.time() - before)
        listener.close()
        sender.close()
        return out
    if backend == "redis":
        import redis

        client = redis.Redis.from_url(dsn)
        subscriber = client.pubsub(ignore_subscribe_messages=True)
        subscriber.subscribe("bench_raw")
        for _ in range(samples):
            before = time.time()
            client.publish("bench_raw", "x")
            while subscriber.get_message(timeout=5) is None:
                pass
            out.append(time.time() - before)
        subscriber.close()
        client.close()
        return out
    path = dsn.removeprefix("sqlite:///")
    watcher = sqlite3.connect(path, check_same_thread=False)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("CREATE TABLE IF NOT EXISTS bench_raw (x)")
    seen = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        last = watcher.execute("PRAGMA data_version").fetchone()[0]
        while not stop.is_set():
            version = watcher.execute("PRAGMA data_version").fetchone()[0]
            if version != last:
                last = version
                seen.set()
            time.sleep(DEFAULT_INTERVAL)

    thread = threading.Thread(target=watch)
    thread.start()
    for _ in range(samples):
        seen.clear()
        before = time.time()
        writer.execute("INSERT INTO bench_raw VALUES (1)")
        seen.wait(5)
        out.append(time.time() - before)
        time.sleep(0.01)
    stop.set()
    thread.join()
    watcher.close()
    writer.close()
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run_backend(backend: str, dsn: str, jobs: int, samples: int) -> list[str]:
    ours, raw = throughput(dsn, backend, jobs)
    rows = [
        f"| {backend} | end to end, {jobs:,} no-op jobs, concurrency {CONCURRENCY} (jobs/s) "
        f"| {ours:,.0f} | {raw:,.0f} (claim {CONCURRENCY} + complete) | {ours / raw:.0%} |"
    ]
    floor = raw_signal_latency(backend, dsn, samples)
    measures: list[tuple[str, Callable[[str, int], list[float]]]] = [
        ("latency, worker in another process", latency_other_process),
        ("latency, worker in this process", latency_same_process),
    ]
    for name, measure in measures:
        values = measure(dsn, samples)
        ours_ms = f"{pct(values, 0.5):.2f} / {pct(values, 0.99):.2f}"
        floor_ms = f"{pct(floor, 0.5):.2f} / {pct(floor, 0.99):.2f}"
        rows.append(f"| {backend} | {name}: p50 / p99 (ms) | {ours_ms} | {floor_ms} (raw) | |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    parser.add_argument("--pg-dsn", help="use this PostgreSQL database (it gets tables)")
    parser.add_argument("--redis-dsn", help="use this Redis database (it gets keys)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=200)
    options = parser.parse_args()
    rows: list[str] = []
    if options.backend in ("sqlite", "all"):
        with tempfile.TemporaryDirectory() as folder:
            dsn = f"sqlite:///{Path(folder) / 'bench.db'}"
            rows += run_backend("sqlite", dsn, options.jobs, options.samples)
    if options.backend in ("postgres", "all"):
        with postgres(options.pg_dsn) as dsn:
            rows += run_backend("postgres", dsn, options.jobs, options.samples)
    if options.backend in ("redis", "all"):
        with redis_database(options.redis_dsn) as dsn:
            rows += run_backend("redis", dsn, options.jobs, options.samples)
    print("| backend | measure | conveyor | raw | conveyor / raw |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
