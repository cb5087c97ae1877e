"""A consumer renews the lease of a job it holds at the lease's rhythm, whatever it hears.

Renewals are counted in the database itself, not in the client: on SQLite and
PostgreSQL a trigger the test adds logs every update of a job's
``lease_expires_at``; on Redis a keyspace notification reports every ``HSET``
of the job's hash (a renewal writes its new expiry there).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from conveyor import App, JobState
from conveyor.store.postgres import listener as pg_listener
from waiting import wait_until

#: The lease the consumers take, and how long the test watches them hold their jobs.
LEASE = 1.5
WATCHED = 2 * LEASE


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing an App waits for its LISTEN thread, which looks for a stop every ``_WAIT`` s."""
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@contextlib.contextmanager
def renewals_counted(dsn: str) -> Iterator[Callable[[int], int]]:
    """From now on, count the renewals of each job: yields ``count(job_id)``."""
    if dsn.startswith("sqlite"):
        with _sqlite_counted(dsn.removeprefix("sqlite:///")) as count:
            yield count
    elif dsn.startswith("redis"):
        with _redis_counted(dsn) as count:
            yield count
    else:
        with _postgres_counted(dsn) as count:
            yield count


@contextlib.contextmanager
def _sqlite_counted(path: str) -> Iterator[Callable[[int], int]]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.executescript(
        """
        CREATE TABLE test_renewals (job_id INTEGER);
        CREATE TRIGGER test_renewal AFTER UPDATE OF lease_expires_at ON jobs
        BEGIN INSERT INTO test_renewals VALUES (NEW.id); END;
        """
    )
    try:
        yield lambda job_id: conn.execute(
            "SELECT count(*) FROM test_renewals WHERE job_id = ?", (job_id,)
        ).fetchone()[0]
    finally:
        conn.close()


@contextlib.contextmanager
def _postgres_counted(dsn: str) -> Iterator[Callable[[int], int]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE test_renewals (job_id bigint)")
        conn.execute(
            "CREATE FUNCTION test_renewal() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO test_renewals VALUES (NEW.id); RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE TRIGGER test_renewal AFTER UPDATE OF lease_expires_at ON jobs "
            "FOR EACH ROW EXECUTE FUNCTION test_renewal()"
        )

        def count(job_id: int) -> int:
            row = conn.execute(
                "SELECT count(*) FROM test_renewals WHERE job_id = %s", (job_id,)
            ).fetchone()
            assert row is not None
            return int(row[0])

        yield count


@contextlib.contextmanager
def _redis_counted(dsn: str) -> Iterator[Callable[[int], int]]:
    import redis

    client = redis.Redis.from_url(dsn)
    before = client.config_get("notify-keyspace-events")["notify-keyspace-events"]
    client.config_set("notify-keyspace-events", "Kh")  # keyspace events of hash commands
    pubsub = client.pubsub()
    pubsub.psubscribe("__keyspace@*__:{conveyor}:job:*")
    wait_until(lambda: pubsub.get_message(timeout=0.1) is not None, what="subscribed")
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def hear(message: dict[str, object]) -> None:
        channel = message["channel"]
        assert isinstance(channel, bytes)
        if message["data"] == b"hset":
            job_id = int(channel.rpartition(b":")[2])
            with lock:
                counts[job_id] = counts.get(job_id, 0) + 1

    def count(job_id: int) -> int:
        # Every message published so far is read before the count is given.
        while (message := pubsub.get_message(timeout=0.2)) is not None:
            hear(message)
        with lock:
            return counts.get(job_id, 0)

    try:
        yield count
    finally:
        pubsub.close()
        client.config_set("notify-keyspace-events", before)
        client.close()


def test_held_jobs_are_renewed_at_the_leases_rhythm(dsn: str) -> None:
    """Two consumers (two Apps, as two processes would be) each hold a job for two leases.

    Each renewal is a commit the other consumer's store feed hears of (SQLite's
    file watch reports every commit); hearing of it must not renew again.
    """
    with App(dsn) as first_app, App(dsn) as second_app:
        first_app.migrate()
        first = first_app.enqueue("step", [1], queue="q")
        second = first_app.enqueue("step", [2], queue="q")
        consumers = [a.consume(["q"], lease=LEASE) for a in (first_app, second_app)]
        try:
            held = [next(c) for c in consumers]
            assert {h.id for h in held} == {first.id, second.id}
            with renewals_counted(dsn) as renewals:
                time.sleep(WATCHED)  # the span measured, not a wait for an event
                counted = {job.id: renewals(job.id) for job in (first, second)}
            for job in held:
                job.complete()
        finally:
            for consumer in consumers:
                consumer.close()
        # Every third of the lease: six in two leases. A busy machine may delay
        # some; a renewal that answers its own commit makes hundreds.
        for job_id, count in counted.items():
            assert 2 <= count <= 3 * (WATCHED / LEASE) + 3, (job_id, counted)
        assert {first_app.get(j.id).state for j in (first, second)} == {JobState.SUCCEEDED}


def test_a_consumer_hears_a_cancel_from_another_process_long_before_its_next_renewal(
    dsn: str,
) -> None:
    """A cancel requested elsewhere reaches a held job through the store's feed, not the lease."""
    with App(dsn) as consuming, App(dsn) as operating:
        consuming.migrate()
        job = operating.enqueue("step", [1], queue="q")
        consumer = consuming.consume(["q"], lease=60)  # renewed every 20 s
        try:
            held = next(consumer)
            assert held.id == job.id
            asked = time.monotonic()
            operating.cancel(job.id)
            wait_until(lambda: bool(held.cancelled), 10, "the consumer hears the cancel")
            assert held.cancelled.reason == "cancel"
            assert time.monotonic() - asked < 15  # well before the renewal would tell
            with held:
                pass  # leaving the block after a cancel request ends it cancelled
        finally:
            consumer.close()
        assert consuming.get(job.id).state == JobState.CANCELLED


def test_a_workers_held_jobs_are_renewed_at_the_leases_rhythm(dsn: str) -> None:
    """The same for two workers (two Apps), each running a job that waits to be let go."""
    release = threading.Event()
    started: list[int] = []
    apps = [App(dsn), App(dsn)]
    try:
        apps[0].migrate()
        for app in apps:

            @app.task(name="hold")
            def hold(n: int) -> None:
                started.append(n)
                release.wait(30)

        jobs = [apps[0].enqueue("hold", [n], queue="q") for n in range(2)]
        workers = [a.worker(queues=["q"], concurrency=1, lease=LEASE) for a in apps]
        for worker in workers:
            worker.start()
        try:
            wait_until(lambda: len(started) == 2, what="both jobs started")
            with renewals_counted(dsn) as renewals:
                time.sleep(WATCHED)  # the span measured, not a wait for an event
                counted = {job.id: renewals(job.id) for job in jobs}
        finally:
            release.set()
            for worker in workers:
                worker.stop()
        for job_id, count in counted.items():
            assert 2 <= count <= 3 * (WATCHED / LEASE) + 3, (job_id, counted)
        assert {apps[0].get(j.id).state for j in jobs} == {JobState.SUCCEEDED}
    finally:
        for app in apps:
            app.close()
