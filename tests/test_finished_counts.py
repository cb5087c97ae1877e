"""Stats count finished jobs without reading them, and stay exact through every change.

``Store.stats`` counts queued and running jobs from their partial indexes and
finished jobs from ``finished_counts`` plus the finishing events not yet folded
into it (migration 011). Random sequences of every operation that moves a job
into, out of or within the finished states are checked here against a direct
``COUNT(*)`` of the jobs table, on both SQL backends, with folds at random
moments (and on Redis, where counts are the sizes of per-state sets, against
every job's hash);
and on PostgreSQL, with a transaction that commits a lower seq after a higher one
was read, and with two stores folding at once.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from conveyor.errors import JobStateError
from conveyor.job import NewJob
from conveyor.store.capabilities import sql_store
from conveyor.store.dsn import open_store
from conveyor.store.protocols import SqlStore, Store
from conveyor.store.records import Finish, Purge
from conveyor.store.sql import load_migrations, load_queries
from outcomes import cancel_one, purge, retry_one

START = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=20.5)
QUEUES = ("q1", "q2")
FINISHES = ("complete", "retry", "fail", "snooze", "release", "cancelled")

SETTINGS = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# 900 steps against a real server take seconds on a quiet machine and minutes on a
# loaded one; a time limit hit halfway also shows up as Hypothesis's "flaky" error.
STATEFUL_LIMIT = pytest.mark.timeout(900)

# --- counting directly ---------------------------------------------------------------------------


def direct_counts(dsn: str) -> dict[tuple[str, str], int]:
    """Jobs per (queue, state), counted row by row: what stats must agree with."""
    query = "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state"
    if dsn.startswith("redis"):
        return redis_direct_counts(dsn)
    if dsn.startswith("sqlite"):
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(query).fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(dsn) as pg:
            rows = pg.execute(query).fetchall()
    return {(q, s): int(n) for q, s, n in rows}


def redis_direct_counts(dsn: str) -> dict[tuple[str, str], int]:
    """On Redis, every job's hash read one by one (stats read the sizes of per-state sets)."""
    import redis

    client = redis.Redis.from_url(dsn, decode_responses=True)
    try:
        counts: dict[tuple[str, str], int] = {}
        for key in client.scan_iter(match="{conveyor}:job:*", count=1000):
            queue, state = client.hmget(key, ["queue", "state"])
            counts[(queue, state)] = counts.get((queue, state), 0) + 1
        return counts
    finally:
        client.close()


def unfolded_counts(dsn: str) -> dict[tuple[str, str], int]:
    """What stats read without folding first: the table plus the unfolded events, and live jobs."""
    if dsn.startswith("redis"):
        return {}  # nothing to fold on Redis: the machine's invariant compares stats there
    if dsn.startswith("sqlite"):
        queries = load_queries("conveyor.store.sqlite")
        conn = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        try:
            rows = conn.execute(queries["stats_counts"]).fetchall()
            queued = conn.execute(queries["stats_queued"], {"now": 0}).fetchall()
        finally:
            conn.close()
    else:
        queries = load_queries("conveyor.store.postgres")
        with psycopg.connect(dsn) as pg:
            pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            xid, seq = pg.execute(queries["stats_folded"].encode()).fetchone()  # type: ignore[misc]
            rows = pg.execute(queries["stats_counts"], {"xid": xid, "seq": seq}).fetchall()
            queued = pg.execute(queries["stats_queued"], {"now": START}).fetchall()
    counts = {(q, s): int(n) for q, s, n in rows}
    counts.update({(q, "queued"): int(n) for q, n, _, _ in queued})
    return counts


def stats_counts(store: Store, now: datetime) -> dict[tuple[str, str], int]:
    stats = store.stats(now)
    return {(q.name, state): n for q in stats.queues.values() for state, n in q.counts.items()}


# --- random sequences of operations --------------------------------------------------------------


class CountsMachine(RuleBasedStateMachine):
    """Every operation that changes a job's state or deletes it, in random order."""

    open_fresh: Callable[[], tuple[Store, str, Callable[[], None]]]

    def __init__(self) -> None:
        super().__init__()
        self.store, self.dsn, self._cleanup = self.open_fresh()
        self.now = START
        self.held: list[tuple[int, str]] = []

    def teardown(self) -> None:
        self._cleanup()

    @rule(queue=st.sampled_from(QUEUES), count=st.integers(1, 4), delay=st.sampled_from([0, 0, 5]))
    def enqueue(self, queue: str, count: int, delay: int) -> None:
        run_at = self.now + timedelta(seconds=delay)
        jobs = [NewJob(queue, "t", "[]", "{}", run_at=run_at) for _ in range(count)]
        self.store.job_insert_many(jobs, self.now)

    @rule(queue=st.sampled_from(QUEUES), limit=st.integers(1, 3))
    def claim(self, queue: str, limit: int) -> None:
        for job in self.store.job_claim([queue], limit, "w", LEASE, self.now):
            self.held.append((job.id, job.lease_token or ""))

    @rule(data=st.data(), kind=st.sampled_from(FINISHES))
    def finish(self, data: st.DataObject, kind: Any) -> None:
        if not self.held:
            return
        job_id, token = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        run_at = self.now + timedelta(seconds=data.draw(st.sampled_from([0, 5])))
        self.store.job_finish(
            [Finish(job_id, token, kind, result_json="1", error="boom", run_at=run_at)], self.now
        )

    @rule()
    def rescue_after_the_leases_ran_out(self) -> None:
        self.now += timedelta(seconds=30)
        self.store.job_rescue_expired(self.now)

    @rule(data=st.data())
    def take_back(self, data: st.DataObject) -> None:
        if self.held:
            job_id, _ = self.held[data.draw(st.integers(0, len(self.held) - 1))]
            self.store.job_take_back([job_id], self.now)

    @rule(job_id=st.integers(1, 40))
    def cancel(self, job_id: int) -> None:
        cancel_one(self.store, job_id, self.now)

    @rule(ids=st.lists(st.integers(1, 40), max_size=5))
    def cancel_many(self, ids: list[int]) -> None:
        self.store.job_cancel_many(ids, self.now)

    @rule(job_id=st.integers(1, 40))
    def retry(self, job_id: int) -> None:
        with contextlib.suppress(JobStateError):  # not failed or cancelled: refused
            retry_one(self.store, job_id, self.now)

    @rule(ids=st.lists(st.integers(1, 40), max_size=5))
    def retry_many(self, ids: list[int]) -> None:
        self.store.job_retry_many(ids, self.now)

    @rule(queue=st.sampled_from([None, *QUEUES]))
    def retry_failed(self, queue: str | None) -> None:
        self.store.job_retry_failed(queue, self.now, self.now)

    @rule(ids=st.lists(st.integers(1, 40), max_size=5))
    def run_now(self, ids: list[int]) -> None:
        self.store.job_run_now(ids, self.now)

    @rule(seconds=st.sampled_from([1, 10]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule(limit=st.integers(1, 5))
    def purge(self, limit: int) -> None:
        purge(self.store, self.now + timedelta(seconds=1), limit)

    @rule(
        states=st.sampled_from([["failed"], ["succeeded", "cancelled"]]),
        queue=st.sampled_from([None, *QUEUES]),
    )
    def purge_where(self, states: list[str], queue: str | None) -> None:
        self.store.job_purge_where(Purge(self.now + timedelta(seconds=1), states, queue), 3)

    @rule(queue=st.sampled_from(QUEUES), keep=st.integers(0, 3))
    def keep_finished(self, queue: str, keep: int) -> None:
        self.store.job_purge_beyond(queue, keep, ("succeeded", "failed", "cancelled"), 10)

    @rule(ids=st.lists(st.integers(1, 40), max_size=5))
    def delete_many(self, ids: list[int]) -> None:
        deleted = set(self.store.job_delete_many(ids))
        self.held = [(i, t) for i, t in self.held if i not in deleted]

    @rule(queue=st.sampled_from(QUEUES))
    def delete_queue(self, queue: str) -> None:
        # As App.delete_queue: the queue's jobs that are not running, then its settings.
        jobs = [j for j in self.store.job_get_many(list(range(1, 41))) if j.queue == queue]
        self.delete_many([j.id for j in jobs if j.state != "running"])
        self.store.queue_delete(queue)

    @precondition(lambda self: isinstance(self.store, SqlStore))
    @rule(ids=st.lists(st.integers(1, 40), max_size=5))
    def archive_delete(self, ids: list[int]) -> None:
        # The Spark archive's delete: on the SQL stores only.
        archive = sql_store(self.store, "archive jobs")
        archive.job_delete_terminal(ids, self.now + timedelta(seconds=1))

    @rule()
    def stats_folds(self) -> None:
        assert stats_counts(self.store, self.now) == direct_counts(self.dsn)

    @invariant()
    def counts_are_exact_without_a_fold(self) -> None:
        if self.dsn.startswith("redis"):
            assert stats_counts(self.store, self.now) == direct_counts(self.dsn)
        else:
            assert unfolded_counts(self.dsn) == direct_counts(self.dsn)


def _machine(open_fresh: Callable[[], tuple[Store, str, Callable[[], None]]]) -> type:
    return type("Machine", (CountsMachine,), {"open_fresh": staticmethod(open_fresh)})


@STATEFUL_LIMIT
def test_sqlite_counts_stay_exact(tmp_path: Path) -> None:
    counter = itertools.count()

    def open_fresh() -> tuple[Store, str, Callable[[], None]]:
        dsn = f"sqlite:///{tmp_path / f'counts-{next(counter)}.db'}"
        store = open_store(dsn)
        store.migrate()
        return store, dsn, store.close

    run_state_machine_as_test(_machine(open_fresh), settings=SETTINGS)


def _empty_postgres(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename NOT IN ('schema_migrations', 'finished_counts_folded')"
                " ORDER BY tablename"
            )
        ]
        conn.execute(
            sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(map(sql.Identifier, tables))
            )
        )
        conn.execute("UPDATE finished_counts_folded SET xid = '0', seq = 0")


@STATEFUL_LIMIT
def test_postgres_counts_stay_exact(pg_clean_dsn: str) -> None:
    open_store(pg_clean_dsn).migrate()

    def open_fresh() -> tuple[Store, str, Callable[[], None]]:
        _empty_postgres(pg_clean_dsn)
        store = open_store(pg_clean_dsn, min_size=1, max_size=2)
        return store, pg_clean_dsn, store.close

    run_state_machine_as_test(_machine(open_fresh), settings=SETTINGS)


@STATEFUL_LIMIT
def test_redis_counts_stay_exact(redis_clean_dsn: str) -> None:
    import redis

    def open_fresh() -> tuple[Store, str, Callable[[], None]]:
        client = redis.Redis.from_url(redis_clean_dsn)
        client.flushall()
        client.close()
        store = open_store(redis_clean_dsn)
        store.migrate()
        return store, redis_clean_dsn, store.close

    run_state_machine_as_test(_machine(open_fresh), settings=SETTINGS)


# --- PostgreSQL: late commits and concurrent folds -----------------------------------------------


@pytest.fixture
def pg_store(pg_clean_dsn: str) -> Iterator[tuple[Store, str]]:
    store = open_store(pg_clean_dsn)
    store.migrate()
    yield store, pg_clean_dsn
    store.close()


def _claimed(store: Store, count: int) -> list[tuple[int, str]]:
    now = datetime.now(UTC)
    store.job_insert_many([NewJob("q", "t", "[]", "{}", run_at=now) for _ in range(count)], now)
    return [(j.id, j.lease_token or "") for j in store.job_claim(["q"], count, "w", LEASE, now)]


def test_postgres_a_finish_committed_late_is_counted_once(
    pg_store: tuple[Store, str],
) -> None:
    """A finish whose event has a lower seq commits after a fold passed a higher one."""
    store, dsn = pg_store
    (early_id, _), (late_id, late_token) = _claimed(store, 2)
    with psycopg.connect(dsn) as early:
        # The early transaction takes its xid and seq first, and commits last.
        early.execute(
            "UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_token = NULL "
            "WHERE id = %s",
            (early_id,),
        )
        early.execute(
            "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
            "VALUES (%s, 'q', 't', 'succeeded', 1, now())",
            (early_id,),
        )
        assert store.job_finish([Finish.complete(late_id, late_token, None)]) == [late_id]
        now = datetime.now(UTC)
        # Folds meanwhile stop below the open transaction: the late event waits too.
        for _ in range(2):
            assert stats_counts(store, now) == {("q", "running"): 1, ("q", "succeeded"): 1}
        early.commit()
    for _ in range(2):
        assert stats_counts(store, now) == {("q", "succeeded"): 2}
        assert unfolded_counts(dsn) == direct_counts(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT jobs FROM finished_counts").fetchall() == [(2,)]


def test_postgres_purge_while_a_finish_is_uncommitted(pg_store: tuple[Store, str]) -> None:
    """A purge that deletes jobs whose events are not yet folded adds them back, once."""
    store, dsn = pg_store
    (open_id, _), *done = _claimed(store, 4)
    with psycopg.connect(dsn) as holder:
        holder.execute("UPDATE jobs SET progress = 0.5 WHERE id = %s", (open_id,))  # an xid
        store.job_finish([Finish.complete(i, t, None) for i, t in done])
        now = datetime.now(UTC)
        stats_counts(store, now)  # folds nothing past the open transaction
        assert purge(store, now + timedelta(seconds=1), limit=2) == 2
        assert stats_counts(store, now) == {("q", "running"): 1, ("q", "succeeded"): 1}
        holder.commit()
    assert (
        stats_counts(store, now)
        == direct_counts(dsn)
        == {("q", "running"): 1, ("q", "succeeded"): 1}
    )


def test_postgres_stores_folding_at_once_never_count_twice(pg_store: tuple[Store, str]) -> None:
    store, dsn = pg_store
    others = [open_store(dsn, min_size=1, max_size=2) for _ in range(3)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def fold_again_and_again(each: Store) -> None:
        try:
            while not stop.is_set():
                each.stats(datetime.now(UTC))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fold_again_and_again, args=(s,)) for s in others]
    for thread in threads:
        thread.start()
    try:
        rng = random.Random(7)
        for _ in range(30):
            held = _claimed(store, 5)
            finishes = [
                Finish(i, t, rng.choice(["complete", "fail", "cancelled"])) for i, t in held
            ]
            store.job_finish(finishes)
            if rng.random() < 0.3:
                store.job_retry_failed(None, datetime.now(UTC), datetime.now(UTC), limit=3)
            if rng.random() < 0.3:
                purge(store, datetime.now(UTC), limit=4)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for other in others:
            other.close()
    assert not errors
    assert stats_counts(store, datetime.now(UTC)) == direct_counts(dsn)


# --- the migration fills the table for an existing database --------------------------------------

OLD_JOBS = [("a", "succeeded"), ("a", "succeeded"), ("a", "failed"), ("b", "cancelled"),
            ("b", "queued"), ("b", "running")]  # fmt: skip


def test_sqlite_migration_counts_an_existing_database(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at REAL NOT NULL)"
    )
    for migration in load_migrations("conveyor.store.sqlite"):
        if migration.version <= 10:
            conn.executescript(migration.sql)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, 0)",
                (migration.version, migration.name),
            )
    for n, (queue, state) in enumerate(OLD_JOBS, start=1):
        finished = None if state in ("queued", "running") else 2
        conn.execute(
            "INSERT INTO jobs (id, queue, task, state, run_at, created_at, finished_at) "
            "VALUES (?, ?, 't', ?, 1, 1, ?)",
            (n, queue, state, finished),
        )
        conn.execute(
            "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
            "VALUES (?, ?, 't', ?, 1, 1)",
            (n, queue, state),
        )
    conn.execute("UPDATE counters SET value = ? WHERE name = 'jobs'", (len(OLD_JOBS),))
    conn.commit()
    conn.close()
    dsn = f"sqlite:///{path}"
    store = open_store(dsn)
    try:
        assert stats_counts(store, START) == direct_counts(dsn)
        assert direct_counts(dsn)[("a", "succeeded")] == 2
    finally:
        store.close()


def test_postgres_migration_counts_an_existing_database(pg_clean_dsn: str) -> None:
    """Including a finish that commits while the migration runs."""
    with psycopg.connect(pg_clean_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
            "applied_at timestamptz NOT NULL)"
        )
        for migration in load_migrations("conveyor.store.postgres"):
            if migration.version <= 10:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (%s, %s, now())",
                    (migration.version, migration.name),
                )
        for n, (queue, state) in enumerate(OLD_JOBS, start=1):
            conn.execute(
                "INSERT INTO jobs (id, queue, task, state, run_at, created_at, finished_at) "
                "VALUES (%s, %s, 't', %s, now(), now(), "
                "CASE WHEN %s IN ('queued', 'running') THEN NULL ELSE now() END)",
                (n, queue, state, state),
            )
            conn.execute(
                "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
                "VALUES (%s, %s, 't', %s, 1, now())",
                (n, queue, state),
            )
        conn.execute("SELECT setval(pg_get_serial_sequence('jobs', 'id'), 100)")
    with psycopg.connect(pg_clean_dsn) as open_finish:
        # A worker finishes job 6 and has not committed when the migration runs.
        open_finish.execute("UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE id = 6")
        open_finish.execute(
            "INSERT INTO events (job_id, queue, task, kind, attempt, at) "
            "VALUES (6, 'b', 't', 'succeeded', 1, now())"
        )
        store = open_store(pg_clean_dsn)
        try:
            # The migration counts while the finish is open, then waits for it
            # (rebuilding jobs_queued needs the table to itself): commit it then.
            migrating = threading.Thread(target=store.migrate)
            migrating.start()
            with psycopg.connect(pg_clean_dsn, autocommit=True) as watch:
                while not watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()[0]:  # type: ignore[index]
                    time.sleep(0.01)
            open_finish.commit()
            migrating.join()
            assert store.schema_version() == store.schema_latest()
            assert stats_counts(store, START) == direct_counts(pg_clean_dsn)
            assert direct_counts(pg_clean_dsn)[("b", "succeeded")] == 1
        finally:
            store.close()


# --- stats never wait for a writer ---------------------------------------------------------------


def test_sqlite_stats_do_not_wait_for_another_writer(tmp_path: Path) -> None:
    """A long write elsewhere (a purge, a migration) holds the lock: stats skip the fold."""
    dsn = f"sqlite:///{tmp_path / 'busy.db'}"
    store = open_store(dsn)
    try:
        store.job_insert_many([NewJob("q", "t", "[]", "{}", run_at=START)], START)
        (job,) = store.job_claim(["q"], 1, "w", LEASE, START)
        store.job_finish([Finish.complete(job.id, job.lease_token or "", None)], START)
        other = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            started = time.monotonic()
            assert stats_counts(store, START) == {("q", "succeeded"): 1}
            assert time.monotonic() - started < 5  # not the 30 s busy timeout
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert stats_counts(store, START) == {("q", "succeeded"): 1}  # folded now
        conn = sqlite3.connect(tmp_path / "busy.db")
        assert conn.execute("SELECT state, jobs FROM finished_counts").fetchall() == [
            ("succeeded", 1)
        ]
        conn.close()
    finally:
        store.close()


def test_postgres_stats_do_not_wait_for_a_delete(pg_store: tuple[Store, str]) -> None:
    """A delete holding the offset's lock: stats read without folding, exact all the same."""
    store, dsn = pg_store
    (job_id, token), _ = _claimed(store, 2)
    store.job_finish([Finish.complete(job_id, token, None)])
    with psycopg.connect(dsn) as deleting:
        deleting.execute("SELECT 1 FROM finished_counts_folded FOR UPDATE")
        assert stats_counts(store, START) == {("q", "running"): 1, ("q", "succeeded"): 1}
        deleting.rollback()
    assert stats_counts(store, START) == direct_counts(dsn)
