"""What each enqueue option costs a job over its life, in units that do not depend on
the machine's speed: statements (PostgreSQL, SQLite) or Redis commands, and WAL
bytes (PostgreSQL) or append-only-file bytes (Redis), per job.

    python benchmarks/option_costs.py                  # every backend, 2,000 jobs an option
    python benchmarks/option_costs.py --backend postgres --jobs 5000

Each option is set on every job: enqueued 100 a call, claimed 10 a call and
completed. "key" gives each job a fresh key (its lookup finds nothing), as
"live", "forever" (on PostgreSQL: the key's lock) and a Unique window;
"replace" enqueues fresh keys with on_conflict="replace"; "retain" a rule of
{"succeeded": 0}, whose own work (the retention round deleting the finished
jobs) is measured apart, beside the queue's age rule deleting as many plain
jobs. The meters are those of fair.py; the load average is printed before and
after (2 shared cores: the counts do not move with it, times would).
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.job import NewJob
from conveyor.retain import resolve_retain
from conveyor.store.dsn import open_store
from conveyor.store.protocols import OperatorStore, Store
from conveyor.store.records import Finish, Purge
from conveyor.store.retaining import RetainingStore
from fair import PgMeter, RedisMeter, SqliteMeter, pg_stat_server
from redis_db import redis_database

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(minutes=5)
PER_CALL, PER_CLAIM = 100, 10
PLAIN = NewJob(queue="bench", task="noop", args_json="[1]", kwargs_json="{}", run_at=NOW)
WINDOW = {"unique_states": ("failed", "succeeded"), "unique_since": NOW - timedelta(hours=1)}
#: Each option: how a job of it is made (keyed ones get a fresh key each).
OPTIONS: dict[str, tuple[NewJob, bool]] = {
    "none": (PLAIN, False),
    "expires": (replace(PLAIN, expires_at=NOW + timedelta(days=1)), False),
    "retain": (replace(PLAIN, retain=resolve_retain({"succeeded": 0})), False),
    "key (live)": (PLAIN, True),
    'key, unique="forever"': (replace(PLAIN, unique="forever"), True),
    "key, Unique(period)": (replace(PLAIN, **WINDOW), True),  # type: ignore[arg-type]
    'key, on_conflict="replace"': (replace(PLAIN, on_conflict="replace"), True),
}


def life(store: Store, job: NewJob, keyed: bool, count: int) -> None:
    """Enqueue ``count`` jobs like ``job``, then claim and complete them all."""
    for _ in range(count // PER_CALL):
        batch = [replace(job, key=secrets.token_hex(8)) if keyed else job for _ in range(PER_CALL)]
        store.job_insert_many(batch, NOW)
    while jobs := store.job_claim(["bench"], PER_CLAIM, "bench", LEASE, NOW):
        store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs], NOW)


def measured(meter: Any, fn: Callable[[], object], count: int) -> tuple[float, float]:
    meter.start()
    fn()
    calls, written = meter.stop()
    return calls / count, written / count


def measure(dsn: str, meter: Any, count: int) -> list[tuple[str, float, float]]:
    store = open_store(dsn)
    store.migrate()
    rows = []
    try:
        life(store, PLAIN, False, PER_CALL)  # warm: the store's first look-ups
        for option, (job, keyed) in OPTIONS.items():
            calls, written = measured(meter, lambda: life(store, job, keyed, count), count)  # noqa: B023
            rows.append((option, calls, written))
        assert isinstance(store, OperatorStore) and isinstance(store, RetainingStore)
        later = NOW + timedelta(days=2)
        # The retention rounds: the jobs' own rule, then the queue's age rule on the rest.
        own = measured(meter, lambda: store.job_purge_retained(later), count)
        rows.append(("retain: its round, per job deleted", *own))
        plain = Purge(later, ["succeeded"], by_policy=True)
        rest = store.job_purge_count(Purge(later, ["succeeded"]))
        policy = measured(meter, lambda: store.job_purge_where(plain, rest), rest)
        rows.append(("none: the queue's age rule, per job deleted", *policy))
    finally:
        store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis"], action="append")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per option (of 100s)")
    options = parser.parse_args()
    backends = options.backend or ["sqlite", "postgres", "redis"]
    count = max(PER_CALL, options.jobs // PER_CALL * PER_CALL)
    print(f"load average before: {os.getloadavg()}")
    print("| store | option | statements / commands per job | WAL / AOF bytes per job |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            if backend == "sqlite":
                rows = measure(f"sqlite:///{folder}/costs.db", SqliteMeter(), count)
            elif backend == "postgres":
                with pg_stat_server() as dsn:
                    rows = measure(dsn, PgMeter(dsn), count)
            else:
                with redis_database(None) as dsn:
                    rows = measure(dsn, RedisMeter(dsn), count)
            for option, calls, written in rows:
                shown = f"{written:,.0f}" if backend != "sqlite" else "-"
                print(f"| {backend} | {option} | {calls:.2f} | {shown} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
