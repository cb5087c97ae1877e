"""What a job costs each store over its whole life, in units that do not depend on
the machine's speed: statements (PostgreSQL, SQLite), commands (Redis), WAL bytes
(PostgreSQL) and append-only-file bytes (Redis) per job.

Each budget sits just above what the store pays today (docs/performance.md, "Cost
budgets"), so that a change that adds a round trip, a statement or a row to a
job's life fails here and has to say why, and raise the budget with the reason.

Two shapes of traffic, as a worker meets them:

- **a burst**: jobs enqueued in one call and run by one worker at concurrency 100
  (claims and finishes batched: the cost per job is mostly rows and bytes);
- **lone jobs**: one job at a time reaching an idle worker (nothing to batch: the
  cost per job is every round trip of its life).

The handlers signal the test through a threading.Event, never through the store,
so that the test's own reads are not counted.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor import App
from conveyor.store.sqlite import base as sqlite_store_module
from pg_server import PgServer

pytestmark = pytest.mark.slow

BURST = 3000
LONE = 150


@dataclass(frozen=True)
class Cost:
    #: statements (SQL) or commands (Redis) per job
    calls: float
    #: WAL bytes (PostgreSQL), append-only-file bytes (Redis), 0 on SQLite
    bytes: float


@dataclass(frozen=True)
class Budget:
    burst_calls: float
    burst_bytes: float
    lone_calls: float
    lone_bytes: float


# Budgets per job: just above what each store measured when they were set
# (docs/performance.md, "Cost budgets"). A lone job on PostgreSQL: its insert,
# the claim (which also answers when the next job is due), its finish. On SQLite the
# file watcher also wakes the worker after the worker's own commits (it cannot
# tell them from another process's): 16 statements a job, and 5 (a claim that
# finds nothing) for each of those wakes, which come between zero and twice a
# job depending on how the commits fall between its checks. On Redis a job in a
# burst is three HSETs (enqueue, claim, finish), two HGETALLs (claim, finish) and
# two XADDs (its events), the claims mostly made by the finishes that free the
# slots; a lone job's claim answers when the next job is due. A burst's calls
# per job depend a little on how its claims and finishes fall into batches (a
# loaded machine makes more, smaller ones): their budgets leave room for that,
# and still fail at one more statement or command a job.
BUDGETS = {
    "postgres": Budget(burst_calls=0.1, burst_bytes=1980, lone_calls=3.1, lone_bytes=2250),
    "sqlite": Budget(burst_calls=1.5, burst_bytes=0, lone_calls=27, lone_bytes=0),
    "redis": Budget(burst_calls=7.8, burst_bytes=1350, lone_calls=34.5, lone_bytes=2080),
}


# --------------------------------------------------------------------------- meters


class PgMeter:
    """Statements from pg_stat_statements (BEGIN and COMMIT counted) of the app's
    database, and WAL bytes from pg_current_wal_lsn(), a CHECKPOINT taken first."""

    def __init__(self, admin_dsn: str, dbname: str) -> None:
        self.admin = psycopg.connect(admin_dsn, autocommit=True)
        self.dbname = dbname
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def start(self) -> None:
        self.admin.execute("CHECKPOINT")
        self.lsn = self._lsn()
        self.admin.execute("SELECT pg_stat_statements_reset()")

    def stop(self) -> tuple[int, int]:
        rows = self.admin.execute(
            "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements AS s"
            " JOIN pg_database AS d ON d.oid = s.dbid WHERE d.datname = %s",
            (self.dbname,),
        ).fetchone()
        assert rows is not None
        if os.environ.get("CONVEYOR_COST_DETAIL"):
            for calls, query in self.admin.execute(
                "SELECT s.calls, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 100)"
                " FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid"
                " WHERE d.datname = %s ORDER BY s.calls DESC",
                (self.dbname,),
            ).fetchall():
                print(f"  {calls:8d} {query}")
        return int(rows[0]), self._lsn() - self.lsn

    def _lsn(self) -> int:
        row = self.admin.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        self.admin.close()


class SqliteMeter:
    """Statements run by every connection the store opens (a trace callback set on
    each, the store's own sqlite3.connect left as it is)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.counting = False
        self._lock = threading.Lock()
        real_connect = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = real_connect(*args, **kwargs)
            conn.set_trace_callback(self._traced)
            return conn

        monkeypatch.setattr(sqlite_store_module.sqlite3, "connect", connect)

    def _traced(self, statement: str) -> None:
        # The file watcher's PRAGMA data_version reads nothing from disk and runs
        # on a timer (how many depends on the machine's speed): not a job's cost.
        if self.counting and not statement.startswith("PRAGMA data_version"):
            with self._lock:
                self.count += 1
                self.kinds[" ".join(statement.split())[:90]] += 1

    def start(self) -> None:
        self.count, self.counting = 0, True
        self.kinds: Counter[str] = Counter()

    def stop(self) -> tuple[int, int]:
        self.counting = False
        if os.environ.get("CONVEYOR_COST_DETAIL"):
            for statement, calls in self.kinds.most_common():
                print(f"  {calls:8d} {statement}")
        return self.count, 0

    def close(self) -> None:
        pass


class RedisMeter:
    """Commands from INFO commandstats (a script's own calls included) and the growth
    of the append-only file (rewrites turned off for the measure)."""

    def __init__(self, dsn: str) -> None:
        import redis

        self.client = redis.Redis.from_url(dsn)
        self.client.config_set("auto-aof-rewrite-percentage", 0)

    def start(self) -> None:
        self.client.config_resetstat()
        self.aof = self._aof()

    def stop(self) -> tuple[int, int]:
        stats = self.client.info("commandstats")
        calls = sum(
            int(v["calls"])
            for name, v in stats.items()
            if name not in ("cmdstat_config|resetstat", "cmdstat_info", "cmdstat_config")
        )
        if os.environ.get("CONVEYOR_COST_DETAIL"):
            for name, v in sorted(stats.items(), key=lambda kv: -int(kv[1]["calls"])):
                print(f"  {int(v['calls']):8d} {name}")
        return calls, self._aof() - self.aof

    def _aof(self) -> int:
        return int(self.client.info("persistence")["aof_current_size"])

    def close(self) -> None:
        self.client.close()


# --------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module")
def pg_stat_server() -> Iterator[PgServer]:
    """A server of its own with pg_stat_statements loaded (it needs a preload)."""
    server = PgServer(
        extra_options=(
            "-c shared_preload_libraries=pg_stat_statements",
            "-c pg_stat_statements.track=all",
        )
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def metered(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[App, Any, str]]:
    if backend == "postgres":
        server: PgServer = request.getfixturevalue("pg_stat_server")
        dbname = f"cost_{uuid.uuid4().hex}"
        with psycopg.connect(server.dsn, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{dbname}"')
        from conftest import dsn_with_dbname

        dsn = dsn_with_dbname(server.dsn, dbname)
        meter: Any = PgMeter(server.dsn, dbname)
    elif backend == "sqlite":
        meter = SqliteMeter(request.getfixturevalue("monkeypatch"))
        dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    else:
        dsn = request.getfixturevalue("redis_clean_dsn")
        meter = RedisMeter(dsn)
    try:
        with App(dsn) as app:
            app.migrate()
            yield app, meter, dsn
    finally:
        meter.close()


def burst_cost(app: App, meter: Any) -> Cost:
    done = threading.Semaphore(0)

    @app.task(queue="cost")
    def noop(i: int) -> None:
        done.release()

    meter.start()
    noop.enqueue_many([((i,), {}) for i in range(BURST)])
    app.run_worker(concurrency=100, burst=True, maintenance=False)
    calls, written = meter.stop()
    assert all(done.acquire(timeout=0) for _ in range(BURST)), "every job ran"
    return Cost(calls / BURST, written / BURST)


def lone_cost(app: App, meter: Any, dsn: str) -> Cost:
    @app.task(queue="cost")
    def noop(i: int) -> None:
        return None

    # No fallback poll within the measure: its claims would count by the clock.
    with app.worker(concurrency=10, maintenance=False, poll_interval=600) as worker:

        def recorded(count: int) -> None:
            # The worker's own tally of outcomes it recorded: no read of the store.
            deadline = time.monotonic() + 60
            while worker.counts["succeeded"] < count:
                assert time.monotonic() < deadline, f"{count} jobs recorded"
                time.sleep(0.001)

        # The jobs come from another App, as from another process: an App's
        # own enqueue also wakes its worker in-process, on top of the store's.
        with App(dsn) as producer:
            send = producer.task(queue="cost", name=noop.name)(lambda i: None)
            # One job first, out of the count: the worker is up, listening and idle.
            send.enqueue(-1)
            recorded(1)
            meter.start()
            for i in range(LONE):
                send.enqueue(i)
                recorded(i + 2)
            calls, written = meter.stop()
    return Cost(calls / LONE, written / LONE)


BACKENDS = ["sqlite", "postgres", "redis"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_burst_cost_per_job_within_budget(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with metered(backend, tmp_path, request) as (app, meter, _):
        cost = burst_cost(app, meter)
    budget = BUDGETS[backend]
    print(f"{backend} burst: {cost}")
    assert cost.calls <= budget.burst_calls, cost
    assert cost.bytes <= budget.burst_bytes, cost


@pytest.mark.parametrize("backend", BACKENDS)
def test_lone_job_cost_within_budget(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with metered(backend, tmp_path, request) as (app, meter, dsn):
        cost = lone_cost(app, meter, dsn)
    budget = BUDGETS[backend]
    print(f"{backend} lone: {cost}")
    assert cost.calls <= budget.lone_calls, cost
    assert cost.bytes <= budget.lone_bytes, cost
