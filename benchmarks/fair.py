"""What a fair claim costs beside a plain one: statements, WAL bytes and Redis commands
per job, and jobs/s, at 100 jobs in flight, with 10 and with 10,000 active keys.

    python benchmarks/fair.py                          # every backend (starts PostgreSQL, Redis)
    python benchmarks/fair.py --backend sqlite --jobs 3000
    python benchmarks/fair.py --limited                # both queues with limits too

Two queues of one database hold the same jobs (``--jobs`` of them, and at least
two a key, spread evenly over the keys as their limit_key): ``plain`` and
``fair`` (``app.fair``). Each is drained by a loop that claims 100 and finishes
them, while the other waits;
the meters count what the loop made the store do. Statements: PostgreSQL's
pg_stat_statements (the server is started with it), SQLite's trace callback;
commands: Redis's INFO commandstats (a script's own calls included). WAL bytes:
pg_current_wal_lsn() around the loop, a CHECKPOINT first. The load average is
printed before and after: these 2 cores are shared. With ``--limited`` both
queues have a concurrency limit and a per-key one (LIMITED_CONCURRENCY, never
reached): the limits' claim beside the fair claim that keeps them.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from conveyor import App
from conveyor.job import NewJob
from conveyor.store.records import Finish
from conveyor.store.sqlite import base as sqlite_base
from redis_db import redis_database

HERE = Path(__file__).resolve().parent
IN_FLIGHT = 100
#: The queue's and each key's concurrency limit with --limited: checked, never reached.
LIMITED_CONCURRENCY = 10 * IN_FLIGHT
LEASE = timedelta(minutes=5)


def jobs_of(queue: str, keys: int, count: int) -> list[NewJob]:
    now = datetime.now(UTC)
    return [
        NewJob(task="t", queue=queue, limit_key=f"tenant-{n % keys}", args_json="[]",
               kwargs_json="{}", run_at=now)
        for n in range(count)
    ]  # fmt: skip


def drain(app: App, queue: str, count: int) -> float:
    """Claim IN_FLIGHT and finish them until ``count`` jobs ran; seconds taken."""
    done = 0
    begun = time.perf_counter()
    while done < count:
        jobs = app.store.job_claim([queue], min(IN_FLIGHT, count - done), "bench", LEASE)
        if not jobs:
            raise RuntimeError(f"{queue} ran dry after {done} jobs")
        app.store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs])
        done += len(jobs)
    return time.perf_counter() - begun


class PgMeter:
    def __init__(self, dsn: str) -> None:
        self.admin = psycopg.connect(dsn, autocommit=True)
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def start(self) -> None:
        self.admin.execute("CHECKPOINT")
        self.lsn = self._lsn()
        self.admin.execute("SELECT pg_stat_statements_reset()")

    def stop(self) -> tuple[int, int]:
        row = self.admin.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
            " WHERE query NOT LIKE '%%pg_stat_statements%%' AND query NOT LIKE '%%wal_lsn%%'"
        ).fetchone()
        return int(row[0]) if row else 0, self._lsn() - self.lsn

    def _lsn(self) -> int:
        row = self.admin.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        return int(row[0]) if row else 0


class SqliteMeter:
    def __init__(self) -> None:
        self.count, self.counting = 0, False
        real_connect = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = real_connect(*args, **kwargs)
            conn.set_trace_callback(self._traced)
            return conn

        sqlite_base.sqlite3.connect = connect  # type: ignore[attr-defined]

    def _traced(self, statement: str) -> None:
        if self.counting and not statement.startswith("PRAGMA data_version"):
            self.count += 1

    def start(self) -> None:
        self.count, self.counting = 0, True

    def stop(self) -> tuple[int, int]:
        self.counting = False
        return self.count, 0


class RedisMeter:
    def __init__(self, dsn: str) -> None:
        import redis

        self.client = redis.Redis.from_url(dsn)
        self.client.config_set("auto-aof-rewrite-percentage", 0)

    def start(self) -> None:
        self.client.config_resetstat()
        self.aof = int(self.client.info("persistence")["aof_current_size"])

    def stop(self) -> tuple[int, int]:
        stats = self.client.info("commandstats")
        calls = sum(
            int(v["calls"])
            for name, v in stats.items()
            if name not in ("cmdstat_config|resetstat", "cmdstat_info", "cmdstat_config")
        )
        return calls, int(self.client.info("persistence")["aof_current_size"]) - self.aof


@contextmanager
def pg_stat_server() -> Iterator[str]:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from pg_server import PgServer

    server = PgServer(
        extra_options=(
            "-c shared_preload_libraries=pg_stat_statements",
            "-c pg_stat_statements.track=all",
        )
    )
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()


def measure(
    dsn: str, meter: Any, keys: int, count: int, limited: bool
) -> dict[str, tuple[float, float, float]]:
    """queue -> (calls per job, bytes per job, jobs/s)."""
    out: dict[str, tuple[float, float, float]] = {}
    with App(dsn) as app:
        app.migrate()
        app.fair("fair")
        for queue in ("plain", "fair") if limited else ():
            app.limit(queue, concurrency=LIMITED_CONCURRENCY)
            app.limit(queue, concurrency=LIMITED_CONCURRENCY, per_key=True)
        for queue in ("plain", "fair"):
            app.enqueue_many(jobs_of(queue, keys, count))
        # One claim each first: the store's look-ups of limits and fair queues.
        for queue in ("plain", "fair"):
            drain(app, queue, IN_FLIGHT)
        for queue in ("plain", "fair"):
            meter.start()
            seconds = drain(app, queue, count - IN_FLIGHT)
            calls, written = meter.stop()
            n = count - IN_FLIGHT
            out[queue] = (calls / n, written / n, n / seconds)
    return out


def report(
    backend: str, keys: int, figures: dict[str, tuple[float, float, float]], limited: bool
) -> None:
    plain, fair = figures["plain"], figures["fair"]
    unit = {"postgres": "statements", "sqlite": "statements", "redis": "commands"}[backend]
    written = {"postgres": "WAL bytes", "sqlite": "-", "redis": "AOF bytes"}[backend]
    label = f"{backend}, limited" if limited else backend
    print(
        f"| {label} | {keys:,} | {unit} {plain[0]:.3f} → {fair[0]:.3f} "
        f"({fair[0] / plain[0]:.2f}x) | {written} {plain[1]:.0f} → {fair[1]:.0f}"
        + (f" ({fair[1] / plain[1]:.2f}x)" if plain[1] else "")
        + f" | {plain[2]:,.0f} → {fair[2]:,.0f} jobs/s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis"], action="append")
    parser.add_argument(
        "--jobs", type=int, default=5000, help="jobs per queue (at least 2 per key)"
    )
    parser.add_argument("--keys", type=int, action="append", help="active keys (10, 10000)")
    parser.add_argument("--limited", action="store_true", help="both queues with limits")
    options = parser.parse_args()
    backends = options.backend or ["sqlite", "postgres", "redis"]
    key_counts = options.keys or [10, 10_000]
    limited = bool(options.limited)
    print(f"load average before: {os.getloadavg()}")
    print("| store | keys | per job (plain → fair) | written per job | speed |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            for keys in key_counts:
                count = max(options.jobs, 2 * keys)
                if backend == "sqlite":
                    dsn = f"sqlite:///{folder}/fair-{keys}.db"
                    figures = measure(dsn, SqliteMeter(), keys, count, limited)
                elif backend == "postgres":
                    with pg_stat_server() as dsn:
                        figures = measure(dsn, PgMeter(dsn), keys, count, limited)
                else:
                    with redis_database(None) as dsn:
                        figures = measure(dsn, RedisMeter(dsn), keys, count, limited)
                report(backend, keys, figures, limited)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
