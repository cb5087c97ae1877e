"""How fast the dashboard's reads are on a big database (a million jobs by default).

    python benchmarks/dashboard.py                      # both backends (starts a PostgreSQL)
    python benchmarks/dashboard.py --backend sqlite --jobs 200000
    python benchmarks/dashboard.py --jobs 10000000 --write-speed
    python benchmarks/dashboard.py --write-cost     # what the dashboard's indexes cost workers
    python benchmarks/dashboard.py --backend redis --jobs 1000000   # a throwaway redis-server

Fills the tables with SQL (a day of work and its history: the newest million
jobs are 98% succeeded and 2% queued, older ones all finished; one job in a
thousand failed with a traceback, twenty queues, 5% of jobs in batches, two
events per job), then times each read of the dashboard and /metrics: the
median of ``--rounds`` calls, in milliseconds. Keyset pages are timed at the
newest page and deep in the table (below the middle id). The backlog (queued
jobs) is the same at a million jobs and at ten: what grows is history.

``--backend redis`` fills a Redis store the same way (its hashes and sorted sets
written directly, by pipeline: a day of finished jobs, one in a thousand
failed) and times what reads finished jobs there: the overview's chart, the
``/metrics`` histogram of a minute, a retention round that passes over jobs it
keeps, and trims (``--redis-dsn`` points it at a server of your own; it is
flushed).

The tasks page (per-task metrics, migration 021) is timed on as many folded
rows as the store ever keeps for the fill's 20 queues x 7 tasks, each busy in
every minute (written directly: each span's rows for as long as they are kept),
whatever the number of jobs; and one fold of ``FOLD_LIMIT`` new events.

``--write-speed`` also times a producer and a worker on the filled database and
on an empty one, alternating (median of ``--rounds``): enqueue_many of 1,000
jobs a call, and the store's claim of 10 then complete, in jobs/s.

``--write-cost`` instead measures a worker's claim-10-then-complete loop (jobs/s)
on a fresh database with and without the index of migration 003, in
alternating rounds (the machine is noisy), median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from conveyor import App
from conveyor.job import JobState, utcnow
from conveyor.store.metrics_protocol import (
    BOUNDS,
    FOLD_LIMIT,
    KEPT,
    TaskMetricsStore,
    span_start,
)
from conveyor.store.records import Finish, Purge
from conveyor.web import task_metrics
from conveyor.web.metrics import Metrics
from metrics_prometheus_client import Metrics as WithLibrary
from pg import postgres
from redis_db import redis_database

HERE = Path(__file__).resolve().parent

SQLITE_FILL = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count)
INSERT INTO jobs (id, queue, task, state, args, run_at, created_at, attempts, batch,
                  started_at, finished_at, error)
SELECT i, 'q' || (i % 20), 't' || (i % 7),
       CASE WHEN i % 1000 = 0 THEN 'failed'
            WHEN i % 50 = 1 AND i > :count - 1000000 THEN 'queued' ELSE 'succeeded' END,
       '[' || i || ']', :now - (:count - i) * 0.08, :now - (:count - i) * 0.08, 1,
       CASE WHEN i % 100 < 5 THEN 'b' || (i / 10000) END,
       CASE WHEN i % 50 <> 1 OR i <= :count - 1000000 THEN :now - (:count - i) * 0.08 END,
       CASE WHEN i % 50 <> 1 OR i <= :count - 1000000 THEN :now - (:count - i) * 0.08 + 0.05 END,
       CASE WHEN i % 1000 = 0 THEN 'Traceback (most recent call last):' || char(10) ||
            '  File "app.py", line 12, in fetch' || char(10) ||
            'TimeoutError: upstream ' || (i % 7) || ' did not answer' END
FROM n
"""
# The same on both databases: an enqueued event per job, an ending per finished one.
EVENTS = """
INSERT INTO events (job_id, queue, task, kind, attempt, worker, at)
SELECT id, queue, task, 'enqueued', 0, NULL, created_at FROM jobs
UNION ALL
SELECT id, queue, task, state, 1, 'w1', finished_at FROM jobs WHERE finished_at IS NOT NULL
ORDER BY 7
"""
PG_FILL = """
INSERT INTO jobs (id, queue, task, state, args, run_at, created_at, attempts, batch,
                  started_at, finished_at, error)
SELECT i, 'q' || (i %% 20), 't' || (i %% 7),
       CASE WHEN i %% 1000 = 0 THEN 'failed'
            WHEN i %% 50 = 1 AND i > %(count)s - 1000000 THEN 'queued' ELSE 'succeeded' END,
       jsonb_build_array(i), t, t, 1,
       CASE WHEN i %% 100 < 5 THEN 'b' || (i / 10000) END,
       CASE WHEN i %% 50 <> 1 OR i <= %(count)s - 1000000 THEN t END,
       CASE WHEN i %% 50 <> 1 OR i <= %(count)s - 1000000 THEN t + interval '50 ms' END,
       CASE WHEN i %% 1000 = 0 THEN 'Traceback (most recent call last):' || chr(10) ||
            '  File "app.py", line 12, in fetch' || chr(10) ||
            'TimeoutError: upstream ' || (i %% 7) || ' did not answer' END
FROM generate_series(1, %(count)s) AS i,
     LATERAL (SELECT %(now)s::timestamptz - (%(count)s - i) * interval '80 ms' AS t) AS times
"""

# Jobs written by SQL bypass the store: count the finished ones as migration 011
# counts an existing database, every event folded (nothing else is running).
COUNTS = """
INSERT INTO finished_counts (queue, state, jobs)
SELECT queue, state, count(*) FROM jobs
WHERE state IN ('succeeded', 'failed', 'cancelled')
GROUP BY queue, state
"""
SQLITE_FOLDED = "UPDATE finished_counts_folded SET seq = (SELECT max(seq) FROM events)"
PG_FOLDED = """
UPDATE finished_counts_folded
SET (xid, seq) = (SELECT xid, seq FROM events ORDER BY xid DESC, seq DESC LIMIT 1)
"""


def fill(app: App, dsn: str, count: int) -> None:
    now = utcnow()
    if dsn.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        conn.execute(SQLITE_FILL, {"count": count, "now": now.timestamp()})
        conn.execute(EVENTS)
        conn.execute(COUNTS)
        conn.execute(SQLITE_FOLDED)
        conn.execute("UPDATE counters SET value = ? WHERE name = 'jobs'", (count,))
        conn.commit()
        conn.execute("ANALYZE")
        conn.close()
    else:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(PG_FILL, {"count": count, "now": now})
            conn.execute(EVENTS)
            conn.execute(COUNTS)
            conn.execute(PG_FOLDED)
            conn.execute("SELECT setval('jobs_id_seq', %s)", (count,))
            conn.execute("VACUUM ANALYZE jobs")
            conn.execute("VACUUM ANALYZE events")


DASHBOARD_INDEXES = ("jobs_queue_state",)


def metric_rows(now: float) -> Iterator[tuple[int, int, str, str, str, int, int, float]]:
    """The most rows per-task metrics ever keep for the fill's 20 queues x 7 tasks
    (and their rows of every task of a queue, and of everything): each span's rows
    as long as KEPT says, the totals; per row, three kinds and six buckets each of
    run time and wait."""
    names = [(f"q{q}", f"t{t}") for q in range(20) for t in range(7)]
    names += [(f"q{q}", "") for q in range(20)] + [("", "")]
    for span in (*KEPT, 0):
        count = int(KEPT[span].total_seconds()) // span if span else 1
        last = span_start(datetime.fromtimestamp(now, UTC), span) if span else 0
        for k in range(count):
            start = last - k * span
            for queue, task in names:
                for kind, n in (("enqueued", 40), ("succeeded", 39), ("failed", 1)):
                    yield (span, start, queue, task, kind, 0, n, 0.0)
                for series in ("run", "wait"):
                    for b in range(10, 16):
                        yield (span, start, queue, task, series, b, 6, 6 * BOUNDS[b])


def fill_metrics(dsn: str) -> int:
    """Write metric_rows, and put the fold's offset FOLD_LIMIT events back."""
    rows = list(metric_rows(utcnow().timestamp()))
    if dsn.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        conn.executemany("INSERT INTO task_metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        conn.execute(
            "UPDATE task_metrics_folded SET seq = (SELECT max(seq) FROM events) - ?",
            (FOLD_LIMIT,),
        )
        conn.commit()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            with conn.cursor().copy("COPY task_metrics FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            conn.execute(
                "UPDATE task_metrics_folded SET (xid, seq) = (SELECT xid, seq FROM events "
                "ORDER BY xid DESC, seq DESC OFFSET %s LIMIT 1)",
                (FOLD_LIMIT,),
            )
            conn.execute("VACUUM ANALYZE task_metrics")
    return len(rows)


def tasks_reads(store: TaskMetricsStore) -> list[tuple[str, Callable[[], Any]]]:
    """The tasks page in each window, of every task and of one."""

    def page(window: str, queue: str | None = None, task: str | None = None) -> Any:
        return lambda: task_metrics.context(store, utcnow(), window, queue, task)

    return [
        ("tasks page, last hour", page("hour")),
        ("tasks page, last day", page("day")),
        ("tasks page, last week", page("week")),
        ("tasks page, one task, last week", page("week", "q3", "t3")),
    ]


def drain_rate(dsn: str, with_indexes: bool, count: int) -> float:
    """Jobs/s of enqueue-then-claim-10-and-complete on a fresh database."""

    with App(dsn) as app:
        app.migrate()
        if not with_indexes:
            drop_indexes(dsn)
        app.enqueue_calls("bench.noop", [((n,), {}) for n in range(count)], _options())
        store = app.store
        started = time.perf_counter()
        while True:
            jobs = store.job_claim(["default"], 10, "w1", timedelta(seconds=60), utcnow())
            if not jobs:
                break
            store.job_finish(
                [Finish.complete(j.id, j.lease_token or "", None) for j in jobs], utcnow()
            )
        return count / (time.perf_counter() - started)


def _options() -> Any:
    from conveyor.task import EnqueueOptions

    return EnqueueOptions()


def drop_indexes(dsn: str) -> None:
    statements = [f"DROP INDEX {name}" for name in DASHBOARD_INDEXES]  # fixed names
    if dsn.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        for statement in statements:
            conn.execute(statement)
        conn.commit()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement.encode())


def write_cost(dsns: Callable[[], Iterator[str]], rounds: int, count: int) -> tuple[float, float]:
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for with_indexes in (False, True):
            for dsn in dsns():
                rates[with_indexes].append(drain_rate(dsn, with_indexes, count))
    return statistics.median(rates[False]), statistics.median(rates[True])


def timed(call: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(dsn: str, count: int, rounds: int) -> list[tuple[str, float]]:
    with App(dsn) as app:
        app.migrate()
        started = time.perf_counter()
        fill(app, dsn, count)
        print(f"  filled {count:,} jobs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        middle = count // 2
        failed = JobState.FAILED
        reads: list[tuple[str, Callable[[], Any]]] = [
            ("jobs, newest page", lambda: app.jobs(limit=51)),
            ("jobs, deep page", lambda: app.jobs(limit=51, before_id=middle)),
            ("failed, newest page", lambda: app.jobs(failed, limit=51)),
            ("failed, deep page", lambda: app.jobs(failed, limit=51, before_id=middle)),
            ("failed + error text", lambda: app.jobs(failed, error="upstream 3", limit=51)),
            ("queue, deep page", lambda: app.jobs(queue="q3", limit=51, before_id=middle)),
            ("queue + failed", lambda: app.jobs(failed, queue="q0", limit=51)),
            ("batch", lambda: app.jobs(batch="b50", limit=51)),
            ("task (no index)", lambda: app.jobs(task="t3", limit=51, before_id=middle)),
            ("error text alone (no index)", lambda: app.jobs(error="upstream 3", limit=51)),
            ("arguments text (bounded, no match)", lambda: app.jobs(args="no such", limit=51)),
            ("arguments text (bounded, a match)", lambda: app.jobs(args="[12345]", limit=51)),
            ("count: task alone (reads the jobs)", lambda: app.count_matching(task="t3")),
            ("count: arguments text (bounded)", lambda: app.count_matching(args="no such")),
            ("count: queue and state", lambda: app.count_matching(queue="q3", state="failed")),
            ("one job and its events", lambda: (app.get(middle), app.events(middle))),
            (
                "throughput, last hour",
                lambda: app.store.stats_finished_per_slot(
                    utcnow() - timedelta(hours=1), timedelta(minutes=1)
                ),
            ),
            ("stats (counts per queue and state)", app.stats),
            ("overview (stats + last hour's throughput)", lambda: overview(app)),
        ]
        results = [(name, timed(call, rounds)) for name, call in reads]
        store = app.store
        assert isinstance(store, TaskMetricsStore)
        rows = fill_metrics(dsn)
        print(f"  wrote {rows:,} per-task metric rows", file=sys.stderr)
        results.append((f"fold of {FOLD_LIMIT:,} new events", timed(store.task_metrics_fold, 1)))
        results += [(name, timed(call, rounds)) for name, call in tasks_reads(store)]
        metrics = Metrics(app)
        results.append(("/metrics, first scrape", timed(metrics.render, 1)))
        # The text written by hand (the dashboard's) and by prometheus_client, in turns.
        library = WithLibrary(app)
        results.append(("/metrics, first scrape (prometheus_client)", timed(library.render, 1)))
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(rounds):
            ours.append(timed(metrics.render, 1))
            theirs.append(timed(library.render, 1))
        results.append(("/metrics, next scrapes", statistics.median(ours)))
        results.append(("/metrics, next scrapes (prometheus_client)", statistics.median(theirs)))
        return results


#: Writes jobs ARGV[1]..ARGV[2] of ARGV[3], the newest finished at ARGV[4], in the server.
REDIS_FILL = """
local P, first, last, count, now = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]),
    tonumber(ARGV[3]), tonumber(ARGV[4])
for i = first, last do
    local q = 'q' .. (i % 20)
    local state = (i % 1000 == 0) and 'failed' or 'succeeded'
    local finished = now - (count - i) * 0.08
    local f, s = string.format('%.6f', finished), string.format('%.6f', finished - 0.05)
    redis.call('HSET', P .. 'job:' .. i, 'id', i, 'queue', q, 'task', 't' .. (i % 7),
               'state', state, 'args', '[' .. i .. ']', 'kwargs', '{}', 'priority', 0,
               'run_at', s, 'attempts', 1, 'max_attempts', 3, 'created_at', s,
               'started_at', s, 'finished_at', f, 'worker', 'w1')
    if state == 'failed' then
        redis.call('HSET', P .. 'job:' .. i, 'error', 'TimeoutError: upstream did not answer')
    end
    redis.call('ZADD', P .. 'qs:' .. #q .. '.' .. q .. ':' .. state, i, i)
    redis.call('ZADD', P .. 'finished', f, i)
    redis.call('HINCRBY', P .. 'queues', q, 1)
end
redis.call('SET', P .. 'ids', last)
"""


def fill_redis(dsn: str, count: int, now: float) -> None:
    """A day of finished jobs (20 queues, one in a thousand failed), written in the server."""
    import redis

    client = redis.Redis.from_url(dsn)
    fill = client.register_script(REDIS_FILL)
    for first in range(1, count + 1, 10_000):
        last = min(first + 9_999, count)
        fill(keys=["{conveyor}:"], args=[first, last, count, f"{now:.6f}"])
    client.close()


def measure_redis(dsn: str, count: int, rounds: int) -> list[tuple[str, float]]:
    import redis

    redis.Redis.from_url(dsn).flushall()
    with App(dsn) as app:
        app.migrate()
        started = time.perf_counter()
        filled_at = utcnow()  # the newest job's finish
        fill_redis(dsn, count, filled_at.timestamp())
        print(f"  filled {count:,} jobs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        store = app.store
        per_queue = count // 20
        finished = ["succeeded", "failed", "cancelled"]
        reads: list[tuple[str, Callable[[], Any]]] = [
            (
                "throughput, last hour",
                lambda: store.stats_finished_per_slot(
                    utcnow() - timedelta(hours=1), timedelta(minutes=1)
                ),
            ),
            (
                "/metrics histogram, a minute's jobs",
                lambda: store.job_run_time_histogram(
                    filled_at - timedelta(minutes=1), filled_at, [0.01, 0.1, 1.0]
                ),
            ),
            ("stats (counts per queue and state)", app.stats),
            ("overview (stats + last hour's throughput)", lambda: overview(app)),
            # No job is cancelled: the round passes over every finished job it may read.
            (
                "retention round, passing over kept jobs",
                lambda: store.job_purge_where(Purge(utcnow(), ["cancelled"])),
            ),
            (
                "trim, nothing beyond keep",
                lambda: store.job_purge_beyond("q3", per_queue, finished),
            ),
        ]
        results = [(name, timed(call, rounds)) for name, call in reads]
        trim = lambda: store.job_purge_beyond("q3", per_queue - 10_000, finished)  # noqa: E731
        results.append(("trim, 10,000 beyond keep (deletes them)", timed(trim, 1)))
        return results


def overview(app: App) -> None:
    """What the dashboard's overview page reads."""
    app.stats()
    app.store.stats_finished_per_slot(utcnow() - timedelta(hours=1), timedelta(minutes=1))


#: Jobs each round of --write-speed enqueues, then claims and completes.
WRITE_JOBS = 20_000


def enqueue_rate(app: App) -> float:
    """Jobs/s of enqueue_many, 1,000 jobs a call, into the queue "default"."""
    calls = [((n,), {}) for n in range(1000)]
    started = time.perf_counter()
    for _ in range(WRITE_JOBS // 1000):
        app.enqueue_calls("bench.noop", calls, _options())
    return WRITE_JOBS / (time.perf_counter() - started)


def claim_rate(app: App) -> float:
    """Jobs/s of the store's claim of 10 then complete, until "default" is empty."""
    store = app.store
    done = 0
    started = time.perf_counter()
    while True:
        jobs = store.job_claim(["default"], 10, "w1", timedelta(seconds=60), utcnow())
        if not jobs:
            break
        store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs])
        done += len(jobs)
    return done / (time.perf_counter() - started)


def write_speed(dsns: dict[str, str], rounds: int) -> dict[str, tuple[float, float]]:
    """(enqueue, claim + complete) jobs/s on each database, median of alternating rounds."""
    rates: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in dsns}
    apps = {name: App(dsn) for name, dsn in dsns.items()}
    try:
        for app in apps.values():
            app.migrate()
        for _ in range(rounds):
            for name, app in apps.items():
                rates[name][0].append(enqueue_rate(app))
                rates[name][1].append(claim_rate(app))
                # Untimed: the round's jobs go, so the empty store stays empty
                # and the full one keeps its size.
                while app.store.job_purge_where(Purge(utcnow(), ["succeeded"], "default")):
                    pass
    finally:
        for app in apps.values():
            app.close()
    return {
        name: (statistics.median(enq), statistics.median(claim))
        for name, (enq, claim) in rates.items()
    }


def print_write_speed(backend: str, count: int, speeds: dict[str, tuple[float, float]]) -> None:
    empty, full = speeds["empty"], speeds["full"]
    print(f"| {backend}, jobs/s (median) | empty store | {count:,} finished jobs | change |")
    print("|---|---:|---:|---:|")
    for i, name in enumerate(("enqueue_many, 1,000 a call", "claim 10 + complete")):
        change = (full[i] - empty[i]) / empty[i] * 100
        print(f"| {name} | {empty[i]:,.0f} | {full[i]:,.0f} | {change:+.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    parser.add_argument("--pg-dsn", help="an empty PostgreSQL database to fill")
    parser.add_argument("--redis-dsn", help="a Redis database to flush and fill")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-cost", action="store_true")
    parser.add_argument(
        "--write-speed",
        action="store_true",
        help="also time enqueue and claim on the filled database and on an empty one",
    )
    options = parser.parse_args()
    if options.write_cost:
        main_write_cost(options)
        return
    table: dict[str, list[tuple[str, float]]] = {}
    speeds: dict[str, dict[str, tuple[float, float]]] = {}
    if options.backend in ("sqlite", "all"):
        with tempfile.TemporaryDirectory() as folder:
            print("sqlite", file=sys.stderr)
            dsn = f"sqlite:///{folder}/dashboard.db"
            table["SQLite"] = measure(dsn, options.jobs, options.rounds)
            if options.write_speed:
                empty = f"sqlite:///{folder}/empty.db"
                speeds["SQLite"] = write_speed({"empty": empty, "full": dsn}, options.rounds)
    if options.backend in ("postgres", "all"):
        with postgres(options.pg_dsn) as dsn:
            print("postgres", file=sys.stderr)
            table["PostgreSQL"] = measure(dsn, options.jobs, options.rounds)
            if options.write_speed:
                with scratch_database(dsn) as empty:
                    dsns = {"empty": empty, "full": dsn}
                    speeds["PostgreSQL"] = write_speed(dsns, options.rounds)
    if options.backend == "redis":
        with redis_database(options.redis_dsn) as dsn:
            print("redis", file=sys.stderr)
            table["Redis"] = measure_redis(dsn, options.jobs, options.rounds)
    backends = list(table)
    print(f"| read, {options.jobs:,} jobs (ms, median) | " + " | ".join(backends) + " |")
    print("|---|" + "---:|" * len(backends))
    names = [name for name, _ in next(iter(table.values()))]
    for i, name in enumerate(names):
        print(f"| {name} | " + " | ".join(f"{table[b][i][1]:.1f}" for b in backends) + " |")
    for backend, speed in speeds.items():
        print()
        print_write_speed(backend, options.jobs, speed)


@contextlib.contextmanager
def scratch_database(base: str) -> Iterator[str]:
    """A new empty database on the server of ``base``, dropped after."""
    import psycopg
    from psycopg import sql

    name = "bench_empty"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(base)._replace(path="/" + name))
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def main_write_cost(options: argparse.Namespace) -> None:
    count = 20_000
    print("| claim 10 + complete, jobs/s | without the index | with it |")
    print("|---|---:|---:|")
    if options.backend in ("sqlite", "all"):

        def sqlite_dbs() -> Iterator[str]:
            with tempfile.TemporaryDirectory() as folder:
                yield f"sqlite:///{folder}/w.db"

        without, with_ = write_cost(sqlite_dbs, options.rounds, count)
        print(f"| SQLite | {without:,.0f} | {with_:,.0f} |")
    if options.backend in ("postgres", "all"):
        with postgres(options.pg_dsn) as base:
            import psycopg
            from psycopg import sql

            numbers = iter(range(1_000_000))

            def pg_dbs() -> Iterator[str]:
                name = f"bench_write_{next(numbers)}"
                with psycopg.connect(base, autocommit=True) as admin:
                    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                try:
                    yield urlunsplit(urlsplit(base)._replace(path="/" + name))
                finally:
                    with psycopg.connect(base, autocommit=True) as admin:
                        admin.execute(
                            sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name))
                        )

            without, with_ = write_cost(pg_dbs, options.rounds, count)
            print(f"| PostgreSQL | {without:,.0f} | {with_:,.0f} |")


if __name__ == "__main__":
    main()
