"""What each enqueue option costs a job, per store: enqueue rows/s and claim +
complete jobs/s with and without the option, and the rate of the work the option
brings (expiry: the maintenance sweep that ends expired jobs).

    .venv/bin/python benchmarks/options.py --backend all --jobs 20000 --rounds 3

Prints the load average before and after: on a shared machine a second busy
process moves every figure by 2-3x, so compare the rows of one run.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conveyor.job import NewJob
from conveyor.store.dsn import open_store
from conveyor.store.expiring import ExpiringStore
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from pg import postgres
from redis_db import redis_database

BATCH = 1000
PER_CLAIM = 10
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
PLAIN = NewJob(queue="bench", task="noop", args_json="[1]", kwargs_json="{}", run_at=NOW)
#: Each option as the one job of a batch it is set on.
OPTIONS: dict[str, NewJob] = {
    "none": PLAIN,
    "expires": replace(PLAIN, expires_at=NOW + timedelta(days=1)),
    # A key per job (each new: the lookup finds nothing), as "live" and as a window.
    "key": PLAIN,
    "key + Unique(period)": replace(
        PLAIN, unique_states=("failed", "succeeded"), unique_since=NOW - timedelta(hours=1)
    ),
}


@dataclass
class Row:
    backend: str
    option: str
    enqueue: float
    claim_complete: float
    extra: str = ""


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def enqueue(store: Store, job: NewJob, count: int, keyed: bool = False) -> None:
    for _ in range(count // BATCH):
        if keyed:
            batch = [replace(job, key=secrets.token_hex(8)) for _ in range(BATCH)]
        else:
            batch = [job] * BATCH
        store.job_insert_many(batch, NOW)


def drain(store: Store) -> int:
    done = 0
    while jobs := store.job_claim(["bench"], PER_CLAIM, "bench-worker", LEASE, NOW):
        finishes = [Finish.complete(j.id, j.lease_token or "", None) for j in jobs]
        store.job_finish(finishes, NOW + timedelta(seconds=1))
        done += len(jobs)
    return done


def sweep_rate(store: Store, count: int) -> float:
    """Expired jobs ended per second by the maintenance sweep (job_expire)."""
    assert isinstance(store, ExpiringStore)
    enqueue(store, replace(PLAIN, expires_at=NOW + timedelta(seconds=1)), count)
    later = NOW + timedelta(seconds=2)
    ended = [0]

    def sweep() -> None:
        while found := store.job_expire(later):
            ended[0] += len(found)

    seconds = timed(sweep)
    return ended[0] / seconds


def bench(backend: str, dsn: str, count: int, rounds: int) -> list[Row]:
    store = open_store(dsn)
    store.migrate()
    rows = []
    try:
        for option, job in OPTIONS.items():
            enqueued, drained, swept = [], [], []
            for _ in range(rounds):
                keyed = option.startswith("key")
                enqueued.append(count / timed(lambda: enqueue(store, job, count, keyed)))  # noqa: B023
                started = time.perf_counter()
                done = drain(store)
                drained.append(done / (time.perf_counter() - started))
                if option == "expires":
                    swept.append(sweep_rate(store, count))
            extra = f"sweep {statistics.median(swept):,.0f} jobs/s" if swept else ""
            rows.append(
                Row(backend, option, statistics.median(enqueued), statistics.median(drained), extra)
            )
    finally:
        store.close()
    return rows


@contextmanager
def sqlite_file() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        yield f"sqlite:///{Path(folder) / 'bench.db'}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    parser.add_argument("--pg-dsn", help="use this PostgreSQL database (it gets tables)")
    parser.add_argument("--redis-dsn", help="use this Redis database (it gets keys)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per round and option")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    rows: list[Row] = []
    if options.backend in ("sqlite", "all"):
        with sqlite_file() as dsn:
            rows += bench("sqlite", dsn, options.jobs, options.rounds)
    if options.backend in ("postgres", "all"):
        with postgres(options.pg_dsn) as dsn:
            rows += bench("postgres", dsn, options.jobs, options.rounds)
    if options.backend in ("redis", "all"):
        with redis_database(options.redis_dsn) as dsn:
            rows += bench("redis", dsn, options.jobs, options.rounds)
    print(f"load average after: {os.getloadavg()}")
    print("| store | option | enqueue (rows/s) | claim 10 + complete (jobs/s) | its own work |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.backend} | {r.option} | {r.enqueue:,.0f} | {r.claim_complete:,.0f} | {r.extra} |"
        )


if __name__ == "__main__":
    main()
