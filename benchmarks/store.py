"""Store throughput beside the raw SQL loop, on the same database in the same process.

    python benchmarks/store.py                      # every backend (starts PostgreSQL, Redis)
    python benchmarks/store.py --backend sqlite
    python benchmarks/store.py --pg-dsn postgresql://user@host:5432/db
    python benchmarks/store.py --backend redis --redis-dsn redis://host:6379/0
    python benchmarks/store.py --backend sqlite --breakdown   # where the SQLite time goes
    python benchmarks/store.py --limits             # limited queues beside an unlimited one

Measures enqueue_many (rows/s, batches of 1,000) and a claim-N-then-complete
loop (jobs/s) for N = 1, 10, 100. On Redis the raw loop is raw_redis.lua: a
list of ready ids popped by a script, a hash per job, a sorted set of leases.
Each figure is the median of ``--rounds`` alternating rounds of the store and
the raw loop, because this machine is noisy: alternating keeps a noisy moment
from favouring one side.

``--limits`` measures, instead, claim N then complete (N = 10, 100) on four
queues side by side in one database: an unlimited one, one with a rate limit,
one with a concurrency limit and one with a per-key concurrency limit (each
limit set high enough never to bind, so the figure is what checking it costs),
and the unlimited queue once more through the claim statement as it was before
limits existed (``claim_before_limits.sql``, run on the store's own connection),
in alternating rounds: the cost of limits to a queue that has none.

``--breakdown`` adds, for SQLite, one more round of each measure with every
statement the store runs timed by its name in queries.sql: microseconds per job
inside SQLite, beside the raw loop's whole cost per job. What is left over is
the store's Python. (SQLite only: a PostgreSQL statement is one round trip,
whose server side EXPLAIN ANALYZE shows.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from conveyor.job import Job, NewJob
from conveyor.limits import Limit, Rate
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, LimitChange
from conveyor.store.sql import load_queries, parse_queries
from pg import postgres
from redis_db import redis_database

HERE = Path(__file__).resolve().parent
BATCH = 1000
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
CLAIM_SIZES = (1, 10, 100)


@dataclass
class Row:
    backend: str
    measure: str
    ours: float
    raw: float

    @property
    def ratio(self) -> float:
        return self.ours / self.raw if self.raw else float("nan")


class RawRedisLoop:
    """The raw loop on Redis (raw_redis.lua): pop ready ids, mark them, a set of leases."""

    PREFIX = "{rawbench}:"

    def __init__(self, dsn: str) -> None:
        import redis

        self.client: Any = redis.Redis.from_url(dsn, decode_responses=True)
        scripts = parse_queries((HERE / "raw_redis.lua").read_text(), where="raw_redis.lua")
        self.claim = self.client.register_script(scripts["claim"])
        self.complete = self.client.register_script(scripts["complete"])
        self.now = f"{NOW.timestamp():.6f}"

    def enqueue(self, count: int) -> None:
        for _ in range(count // BATCH):
            last = self.client.incrby(self.PREFIX + "ids", BATCH)
            pipe = self.client.pipeline(transaction=True)
            for job_id in range(last - BATCH + 1, last + 1):
                pipe.hset(
                    f"{self.PREFIX}job:{job_id}",
                    mapping={"queue": "bench", "task": "noop", "args": "[1]", "kwargs": "{}",
                             "state": "queued", "run_at": self.now, "created_at": self.now},
                )  # fmt: skip
            pipe.rpush(self.PREFIX + "ready", *range(last - BATCH + 1, last + 1))
            pipe.execute()

    def drain(self, per_claim: int) -> int:
        done = 0
        expires = f"{NOW.timestamp() + 30:.6f}"
        while True:
            ids = self.claim(keys=[self.PREFIX], args=[per_claim, expires, self.now])
            if not ids:
                return done
            self.complete(keys=[self.PREFIX], args=[self.now, *ids])
            done += len(ids)

    def close(self) -> None:
        self.client.close()


def raw_loop(backend: str, dsn: str) -> RawLoop | RawRedisLoop:
    return RawRedisLoop(dsn) if backend == "redis" else RawLoop(backend, dsn)


class RawLoop:
    """The least a queue can do on this database: the yardstick."""

    def __init__(self, backend: str, dsn: str) -> None:
        self.backend = backend
        self.q = parse_queries((HERE / f"raw_{backend}.sql").read_text(), where=backend)
        if backend == "sqlite":
            import sqlite3

            path = dsn.removeprefix("sqlite:///")
            self.conn: Any = sqlite3.connect(path, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = NORMAL")
            self.now: Any = NOW.timestamp()
        else:
            import psycopg

            self.conn = psycopg.connect(dsn)
            self.now = NOW
        self.conn.execute(self.q["create"])
        self.conn.execute(self.q["index"])
        self._commit()

    def _commit(self) -> None:
        if self.backend == "postgres":
            self.conn.commit()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        if self.backend == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
            yield
            self.conn.execute("COMMIT")
        else:
            yield
            self.conn.commit()

    def enqueue(self, count: int) -> None:
        rows = [("bench", "noop", "[1]", "{}", self.now, self.now)] * BATCH
        for _ in range(count // BATCH):
            with self.transaction():
                self.conn.cursor().executemany(self.q["insert"], rows)

    def drain(self, per_claim: int) -> int:
        done = 0
        while True:
            with self.transaction():
                claim = (self.now, "bench", self.now, per_claim)
                ids = [r[0] for r in self.conn.execute(self.q["claim"], claim)]
            if not ids:
                return done
            with self.transaction():
                param = json.dumps(ids) if self.backend == "sqlite" else ids
                self.conn.execute(self.q["complete"], (self.now, param))
            done += len(ids)

    def close(self) -> None:
        self.conn.close()


def store_enqueue(store: Store, count: int) -> None:
    batch = [NewJob(queue="bench", task="noop", args_json="[1]", kwargs_json="{}", run_at=NOW)]
    for _ in range(count // BATCH):
        store.job_insert_many(batch * BATCH, NOW)


def store_drain(store: Store, per_claim: int) -> int:
    done = 0
    while True:
        jobs = store.job_claim(["bench"], per_claim, "bench-worker", LEASE, NOW)
        if not jobs:
            return done
        store.job_finish(
            [Finish.complete(j.id, j.lease_token or "", None) for j in jobs],
            NOW + timedelta(seconds=1),
        )
        done += len(jobs)


def refill(raw: RawLoop | RawRedisLoop, store: Store, per_claim: int, drain_count: int) -> None:
    """Empty both queues, then enqueue the jobs of one drain round on each side."""
    count = drain_count if per_claim > 1 else drain_count // 4  # claims of 1 are slow
    raw.drain(10_000)
    store_drain(store, 10_000)
    raw.enqueue(count)
    store_enqueue(store, count)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def bench_backend(
    backend: str, dsn: str, enqueue_count: int, drain_count: int, rounds: int
) -> list[Row]:
    store = open_store(dsn)
    store.migrate()
    raw = raw_loop(backend, dsn)
    rows: list[Row] = []
    try:
        ours, theirs = [], []
        for _ in range(rounds):
            theirs.append(enqueue_count / timed(lambda: raw.enqueue(enqueue_count)))
            ours.append(enqueue_count / timed(lambda: store_enqueue(store, enqueue_count)))
        rows.append(
            Row(
                backend, "enqueue_many (rows/s)", statistics.median(ours), statistics.median(theirs)
            )
        )
        # The drain rounds start from the jobs enqueued above, topped up each round.
        for per_claim in CLAIM_SIZES:
            ours, theirs = [], []
            for _ in range(rounds):
                refill(raw, store, per_claim, drain_count)
                done_raw = [0]
                done_ours = [0]
                t_raw = timed(lambda: done_raw.__setitem__(0, raw.drain(per_claim)))  # noqa: B023
                t_ours = timed(lambda: done_ours.__setitem__(0, store_drain(store, per_claim)))  # noqa: B023
                theirs.append(done_raw[0] / t_raw)
                ours.append(done_ours[0] / t_ours)
            rows.append(
                Row(
                    backend,
                    f"claim {per_claim} + complete (jobs/s)",
                    statistics.median(ours),
                    statistics.median(theirs),
                )
            )
    finally:
        raw.close()
        store.close()
    return rows


class TimedConnection(sqlite3.Connection):
    """A SQLite connection adding up the time of each statement, by its name in queries.sql."""

    totals: ClassVar[collections.Counter[str]] = collections.Counter()
    names: ClassVar[dict[str, str]] = {
        sql: name for name, sql in load_queries("conveyor.store.sqlite").items()
    }

    def _timed(self, sql: str, run: Callable[[], sqlite3.Cursor]) -> Any:
        started = time.perf_counter()
        # fetchall: a statement's work is done when its rows are, not when it starts.
        rows = FetchedRows(run().fetchall())
        self.totals[self.names.get(sql, sql.split()[0])] += time.perf_counter() - started
        return rows

    def execute(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
        return self._timed(sql, lambda: super(TimedConnection, self).execute(sql, *args))

    def executemany(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
        return self._timed(sql, lambda: super(TimedConnection, self).executemany(sql, *args))


class FetchedRows(list[Any]):
    """A statement's rows, answering the cursor calls the store's hot paths make."""

    def fetchall(self) -> list[Any]:
        return list(self)

    def fetchone(self) -> Any:
        return self[0] if self else None


@contextlib.contextmanager
def timed_statements() -> Iterator[collections.Counter[str]]:
    """Connections opened inside this block time their statements into the yielded counter."""
    connect = sqlite3.connect
    TimedConnection.totals = collections.Counter()

    def timed_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, **kwargs, factory=TimedConnection)

    sqlite3.connect = timed_connect  # type: ignore[assignment]
    try:
        yield TimedConnection.totals
    finally:
        sqlite3.connect = connect  # type: ignore[assignment]


def breakdown(dsn: str, enqueue_count: int, drain_count: int) -> None:
    """Print microseconds per job in each SQLite statement of the store, beside the raw loop."""
    raw = RawLoop("sqlite", dsn)
    with timed_statements() as totals:
        store = open_store(dsn)
    print("\n| measure | where | µs per job |")
    print("|---|---|---:|")

    def report(measure: str, jobs: int, seconds: float, raw_jobs: int, raw_seconds: float) -> None:
        for name, spent in totals.most_common():
            print(f"| {measure} | statement {name} | {spent / jobs * 1e6:.1f} |")
        print(f"| {measure} | all statements | {sum(totals.values()) / jobs * 1e6:.1f} |")
        print(f"| {measure} | the store, in all | {seconds / jobs * 1e6:.1f} |")
        print(f"| {measure} | the raw loop, in all | {raw_seconds / raw_jobs * 1e6:.1f} |")

    try:
        totals.clear()
        seconds = timed(lambda: store_enqueue(store, enqueue_count))
        raw_seconds = timed(lambda: raw.enqueue(enqueue_count))
        report("enqueue_many", enqueue_count, seconds, enqueue_count, raw_seconds)
        for per_claim in CLAIM_SIZES:
            refill(raw, store, per_claim, drain_count)
            totals.clear()
            started = time.perf_counter()
            jobs = store_drain(store, per_claim)
            seconds = time.perf_counter() - started
            started = time.perf_counter()
            raw_jobs = raw.drain(per_claim)
            raw_seconds = time.perf_counter() - started
            report(f"claim {per_claim} + complete", jobs, seconds, raw_jobs, raw_seconds)
    finally:
        raw.close()
        store.close()


# --- limits ------------------------------------------------------------------------------

#: The limited queues of --limits, and their limits: never reached by a claim-complete loop.
RATE = Limit(rate=Rate(100_000, 1.0))
CONCURRENCY = Limit(concurrency=10_000)
PER_KEY = Limit(concurrency=1)
KEYS = 1000
LIMIT_CASES = {
    "unlimited, claim before limits": "bench_before",
    "unlimited": "bench_free",
    "rate 100,000/s": "bench_rate",
    "concurrency 10,000": "bench_conc",
    f"per key: 1 at once, {KEYS:,} keys": "bench_keyed",
}
LIMIT_CLAIM_SIZES = (10, 100)


class ClaimBeforeLimits:
    """The store's claim as it was before limits: the frozen statement, the store's connection."""

    def __init__(self, store: Store, backend: str) -> None:
        self.store = store
        self.backend = backend
        self.sql = parse_queries((HERE / "claim_before_limits.sql").read_text())[
            f"{backend}_job_claim"
        ]

    def claim(self, queue: str, limit: int) -> list[Job]:
        token = secrets.token_hex(16)
        if self.backend == "sqlite":
            from conveyor.store.sqlite.base import _row_to_job as sqlite_job

            now = datetime.now(UTC)
            params = {
                "queues": json.dumps([queue]), "limit": limit, "worker": "bench-worker",
                "token": token, "lease_expires_at": (now + LEASE).timestamp(),
                "now": now.timestamp(), "group": None,
            }  # fmt: skip
            store: Any = self.store
            with store._write() as conn:
                jobs = [sqlite_job(r) for r in conn.execute(self.sql, params)]
                store._record(conn, "claim", [j.id for j in jobs], now.timestamp())
        else:
            from conveyor.store.postgres.base import _row_to_job as postgres_job

            params = {
                "queues": [queue], "limit": limit, "worker": "bench-worker", "token": token,
                "lease": LEASE, "now": None, "group": None,
            }  # fmt: skip
            with self.store._conn() as conn:  # type: ignore[attr-defined]
                jobs = [postgres_job(r) for r in conn.execute(self.sql, params).fetchall()]
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs


def limited_drain(claim: Callable[[int], list[Job]], store: Store, per_claim: int) -> int:
    """Claim and complete until nothing is left, on the store's clock (rates count real time)."""
    done = 0
    while True:
        jobs = claim(per_claim)
        if not jobs:
            return done
        store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs])
        done += len(jobs)


def limit_fill(store: Store, queue: str, count: int) -> None:
    keyed = queue == LIMIT_CASES[f"per key: 1 at once, {KEYS:,} keys"]
    for start in range(0, count, BATCH):
        batch = [
            NewJob(
                queue=queue, task="noop", args_json="[1]", kwargs_json="{}", run_at=NOW,
                limit_key=f"k{(start + i) % KEYS}" if keyed else None,
            )
            for i in range(min(BATCH, count - start))
        ]  # fmt: skip
        store.job_insert_many(batch, NOW)


def bench_limits(backend: str, dsn: str, drain_count: int, rounds: int) -> list[LimitRow]:
    store = open_store(dsn)
    store.migrate()
    now = datetime.now(UTC)
    store.limit_set(LimitChange(LIMIT_CASES["rate 100,000/s"], RATE), now)
    store.limit_set(LimitChange(LIMIT_CASES["concurrency 10,000"], CONCURRENCY), now)
    store.limit_set(
        LimitChange(LIMIT_CASES[f"per key: 1 at once, {KEYS:,} keys"], PER_KEY, per_key=True), now
    )
    before = ClaimBeforeLimits(store, backend)

    def claimer(queue: str) -> Callable[[int], list[Job]]:
        if queue == "bench_before":
            return lambda n: before.claim(queue, n)
        return lambda n: store.job_claim([queue], n, "bench-worker", LEASE)

    rows: list[LimitRow] = []
    try:
        for per_claim in LIMIT_CLAIM_SIZES:
            rates: dict[str, list[float]] = {case: [] for case in LIMIT_CASES}
            paired: dict[str, list[float]] = {case: [] for case in PAIRED}
            for round_number in range(rounds):
                # The unlimited claim before and after limits, a batch of each in turn:
                # a busy moment of this shared machine slows both alike.
                for queue in PAIRED.values():
                    limit_fill(store, queue, drain_count)
                for case, rate in paired_drain(store, PAIRED, claimer, per_claim).items():
                    paired[case].append(rate)
                # Each queue drained on its own (a rate's cost depends on its own pace),
                # in alternating order so that no case always runs on a warmer machine.
                cases = list(LIMIT_CASES.items())
                for case, queue in cases if round_number % 2 == 0 else reversed(cases):
                    limit_fill(store, queue, drain_count)
                    started = time.perf_counter()
                    done = limited_drain(claimer(queue), store, per_claim)
                    seconds = time.perf_counter() - started
                    assert done == drain_count, (case, done)
                    rates[case].append(done / seconds)
            rows.append(
                LimitRow(
                    backend,
                    per_claim,
                    {c: statistics.median(r) for c, r in rates.items()},
                    {c: statistics.median(r) for c, r in paired.items()},
                )
            )
    finally:
        store.close()
    return rows


#: The cases measured in turn, a batch each: the unlimited claim before and after limits.
PAIRED = {"before limits": "bench_before", "now": "bench_free"}


def paired_drain(
    store: Store,
    cases: dict[str, str],
    claimer: Callable[[str], Callable[[int], list[Job]]],
    per_claim: int,
) -> dict[str, float]:
    """Claim and complete a batch of each case in turn until all are empty; jobs/s of each."""
    claims = {case: claimer(queue) for case, queue in cases.items()}
    spent = dict.fromkeys(cases, 0.0)
    done = dict.fromkeys(cases, 0)
    left = set(cases)
    turn = 0
    while left:
        order = list(cases) if turn % 2 == 0 else list(reversed(cases))
        turn += 1
        for case in order:  # who goes first alternates too
            if case not in left:
                continue
            started = time.perf_counter()
            jobs = claims[case](per_claim)
            if jobs:
                store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs])
            spent[case] += time.perf_counter() - started
            done[case] += len(jobs)
            if not jobs:
                left.discard(case)
    return {case: done[case] / spent[case] for case in cases}


@dataclass
class LimitRow:
    backend: str
    per_claim: int
    rates: dict[str, float]
    paired: dict[str, float]


def print_limits_tables(rows: list[LimitRow]) -> None:
    print("Unlimited queue, the claim before limits and now, a batch of each in turn:\n")
    print("| backend | measure | before limits | now | now / before |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        before, now = r.paired["before limits"], r.paired["now"]
        measure = f"claim {r.per_claim} + complete (jobs/s)"
        print(f"| {r.backend} | {measure} | {before:,.0f} | {now:,.0f} | {now / before:.0%} |")
    cases = list(LIMIT_CASES)
    print("\nEach queue drained on its own (limits set high enough never to bind):\n")
    print("| backend | measure | " + " | ".join(cases) + " |")
    print("|---|---|" + "---:|" * len(cases))
    for r in rows:
        cells = " | ".join(f"{r.rates[c]:,.0f}" for c in cases)
        print(f"| {r.backend} | claim {r.per_claim} + complete (jobs/s) | {cells} |")


def print_table(rows: list[Row]) -> None:
    print("| backend | measure | conveyor | raw loop (SQL, or Lua on Redis) | conveyor / raw |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r.backend} | {r.measure} | {r.ours:,.0f} | {r.raw:,.0f} | {r.ratio:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    parser.add_argument("--pg-dsn", help="use this PostgreSQL database (it gets tables)")
    parser.add_argument("--redis-dsn", help="use this Redis database (it gets keys)")
    parser.add_argument("--enqueue", type=int, default=100_000, help="jobs per enqueue round")
    parser.add_argument("--drain", type=int, default=20_000, help="jobs per drain round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--breakdown", action="store_true", help="time each SQLite statement of the store"
    )
    parser.add_argument(
        "--limits",
        action="store_true",
        help="claim throughput of limited queues beside an unlimited one (and the claim before)",
    )
    options = parser.parse_args()

    if options.limits:
        limit_rows: list[LimitRow] = []
        if options.backend in ("sqlite", "all"):
            with tempfile.TemporaryDirectory() as folder:
                dsn = f"sqlite:///{Path(folder) / 'bench.db'}"
                limit_rows += bench_limits("sqlite", dsn, options.drain, options.rounds)
        if options.backend in ("postgres", "all"):
            with postgres(options.pg_dsn) as dsn:
                limit_rows += bench_limits("postgres", dsn, options.drain, options.rounds)
        print_limits_tables(limit_rows)
        return

    rows: list[Row] = []
    if options.backend in ("sqlite", "all"):
        with tempfile.TemporaryDirectory() as folder:
            dsn = f"sqlite:///{Path(folder) / 'bench.db'}"
            rows += bench_backend("sqlite", dsn, options.enqueue, options.drain, options.rounds)
            if options.breakdown:
                breakdown(dsn, options.enqueue, options.drain)
    if options.backend in ("postgres", "all"):
        with postgres(options.pg_dsn) as dsn:
            rows += bench_backend("postgres", dsn, options.enqueue, options.drain, options.rounds)
    if options.backend in ("redis", "all"):
        with redis_database(options.redis_dsn) as dsn:
            rows += bench_backend("redis", dsn, options.enqueue, options.drain, options.rounds)
    print_table(rows)


if __name__ == "__main__":
    main()
