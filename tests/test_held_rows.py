"""A transaction that holds a job's row (``ctx.complete`` before its commit) stalls no duty.

Rescue, lease renewal and the worker's finish pass over a row another
transaction holds instead of waiting for it (PostgreSQL: ``SKIP LOCKED``), lock
the rows they change in id order (so they cannot deadlock each other); on
SQLite a renewal counts its lease from the moment it holds the write lock, and
a rescue round gives up after a write waited for that lock (see
docs/architecture.md, "Rows another transaction holds"). Real transactions held
open on real databases, real leases running out.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest

from conveyor import App, Context, JobState
from conveyor.job import NewJob, utcnow
from conveyor.store.dsn import open_store
from conveyor.store.records import Finish, Lease
from conveyor.worker.maintenance import round_interval
from store_fixtures import sql_only
from test_effects import effect_db, insert_effect
from waiting import DEADLINE, wait_until

T = TypeVar("T")
postgres_only = pytest.mark.parametrize("dsn", ["postgres"], indirect=True)


def kinds(app_or_store: Any, job_id: int) -> list[str]:
    events = (
        app_or_store.events(job_id)
        if isinstance(app_or_store, App)
        else app_or_store.event_list(job_id)
    )
    return [e.kind for e in events]


def in_thread(call: Callable[[], T]) -> T:
    """``call()`` in another thread; fails the test if it does not return within the deadline
    (a statement waiting for a row that the test's own transaction holds)."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=DEADLINE)
    finally:
        pool.shutdown(wait=False)  # on a timeout, the test's transaction ends and lets it go


def claimed(store: Any, count: int, lease: timedelta) -> list[Lease]:
    now = utcnow()
    store.job_insert_many([NewJob("q", "t", "[]", "{}", now) for _ in range(count)], now)
    jobs = sorted(store.job_claim(["q"], count, "w", lease), key=lambda j: j.id)
    assert len(jobs) == count
    return [Lease(j.id, j.lease_token) for j in jobs]


def lapsed(store: Any, leases: list[Lease]) -> Callable[[], bool]:
    """Whether every one of these leases has run out (judged a little late, so that the
    database's clock, which judges them, agrees)."""

    def check() -> bool:
        jobs = store.job_get_many([le.id for le in leases])
        return all(
            j.lease_expires_at is not None
            and utcnow() > j.lease_expires_at + timedelta(seconds=0.05)
            for j in jobs
        )

    return check


def connect_shared(dsn: str) -> Any:
    """A connection to the queue's database that another thread may commit."""
    if dsn.startswith("sqlite"):
        return sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=30, check_same_thread=False)
    return psycopg.connect(dsn)


@contextmanager
def held_by_complete(dsn: str, store: Any, lease: Lease) -> Iterator[Any]:
    """A transaction that ran ctx.complete's statement for ``lease`` and has not committed."""
    with psycopg.connect(dsn) as conn:
        insert_effect(conn, lease.id, "held")
        assert store.job_complete_in(lease, '"from the transaction"', conn) is True
        yield conn


# --- the statements, on PostgreSQL (SQLite has one writer: nothing to pass over) ------


@postgres_only
def test_rescue_passes_over_a_row_a_transaction_holds(store: Any, dsn: str) -> None:
    """A worker frozen before its commit does not hold back the rescue of other jobs."""
    with effect_db(dsn):
        frozen, lost = claimed(store, 2, timedelta(seconds=1))
        with held_by_complete(dsn, store, frozen) as conn:
            wait_until(lapsed(store, [frozen, lost]), what="both leases ran out")
            assert in_thread(store.job_rescue_expired) == [lost.id]
            conn.commit()
        # Tried again by the next round: the commit decided it meanwhile.
        assert store.job_rescue_expired() == []
    done = store.job_get(frozen.id)
    assert (done.state, done.result) == (JobState.SUCCEEDED, "from the transaction")
    assert kinds(store, frozen.id) == ["enqueued", "claimed", "succeeded"]
    assert store.job_get(lost.id).state == JobState.QUEUED
    assert kinds(store, lost.id) == ["enqueued", "claimed", "rescued"]


@postgres_only
def test_a_rescue_that_met_a_held_row_takes_it_after_a_rollback(store: Any, dsn: str) -> None:
    with effect_db(dsn):
        (frozen,) = claimed(store, 1, timedelta(seconds=1))
        with held_by_complete(dsn, store, frozen) as conn:
            wait_until(lapsed(store, [frozen]), what="the lease ran out")
            assert in_thread(store.job_rescue_expired) == []
            conn.rollback()
        assert store.job_rescue_expired() == [frozen.id]
    assert store.job_get(frozen.id).state == JobState.QUEUED


@postgres_only
def test_renewal_passes_over_a_held_row_without_losing_its_lease(store: Any, dsn: str) -> None:
    first, held, last = claimed(store, 3, timedelta(seconds=30))
    before = {j.id: j.lease_expires_at for j in store.job_get_many([first.id, held.id, last.id])}
    with effect_db(dsn), held_by_complete(dsn, store, held) as conn:
        leases = [last, held, first]  # not in id order
        statuses = {
            s.id: s for s in in_thread(lambda: store.job_heartbeat(leases, timedelta(minutes=5)))
        }
        # The held job is answered (its lease is not lost), as busy: not renewed now.
        assert set(statuses) == {first.id, held.id, last.id}
        assert statuses[held.id].busy and not statuses[held.id].cancel_requested
        assert not statuses[first.id].busy and not statuses[last.id].busy
        conn.rollback()
    after = {j.id: j.lease_expires_at for j in store.job_get_many([first.id, held.id, last.id])}
    assert after[held.id] == before[held.id]
    assert after[first.id] > before[first.id] + timedelta(minutes=4)  # type: ignore[operator]
    assert after[last.id] > before[last.id] + timedelta(minutes=4)  # type: ignore[operator]
    # Free again: the next renewal renews it.
    (again,) = store.job_heartbeat([held], timedelta(minutes=5))
    assert again.id == held.id and not again.busy
    assert store.job_get(held.id).lease_expires_at > after[first.id] - timedelta(minutes=1)


@postgres_only
def test_finish_passes_over_a_row_its_own_complete_holds(store: Any, dsn: str) -> None:
    """The worker's finish of a batch is not held back by one job's open transaction."""
    held, other = claimed(store, 2, timedelta(seconds=30))
    with effect_db(dsn), held_by_complete(dsn, store, held) as conn:
        finishes = [
            Finish.complete(other.id, other.token, '"returned"'),
            Finish.complete(held.id, held.token, '"returned"'),
        ]
        assert in_thread(lambda: store.job_finish(finishes)) == [other.id]
        assert store.job_get(held.id).state == JobState.RUNNING  # not committed yet
        conn.commit()
    assert store.job_get(held.id).result == "from the transaction"
    assert store.job_get(other.id).result == "returned"
    assert kinds(store, held.id) == ["enqueued", "claimed", "succeeded"]


@postgres_only
def test_finishes_and_renewals_of_the_same_rows_never_deadlock(store: Any, dsn: str) -> None:
    """Both lock their rows in id order, whatever the order of their arrays."""
    rounds, size = 25, 60
    errors: list[BaseException] = []
    for _ in range(rounds):
        leases = claimed(store, size, timedelta(seconds=30))
        start = threading.Barrier(3)

        def renew(order: list[Lease], start: threading.Barrier = start) -> None:
            start.wait()
            try:
                for _ in range(3):
                    store.job_heartbeat(order, timedelta(seconds=30))
            except Exception as exc:
                errors.append(exc)

        def finish(order: list[Lease], start: threading.Barrier = start) -> None:
            start.wait()
            try:
                store.job_finish([Finish.complete(le.id, le.token, "null") for le in order])
            except Exception as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=renew, args=(leases,)),
            threading.Thread(target=renew, args=(leases[::-1],)),
            threading.Thread(target=finish, args=(leases[::-1],)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=DEADLINE)
        assert not errors, errors[0]
        # Whatever it passed over is left for the worker to finish again.
        rest = [le for le in leases if store.job_get(le.id).state == JobState.RUNNING]
        store.job_finish([Finish.complete(le.id, le.token, "null") for le in rest])


# --- a worker whose handler holds a transaction open -----------------------------------


@sql_only
def test_a_slow_commit_does_not_run_the_workers_other_jobs_twice(app: App, dsn: str) -> None:
    """While one handler's transaction holds its job (PostgreSQL: its row; SQLite: the write
    lock) past the lease, the worker's other job keeps its lease: no rescue, no second run."""
    lease = 1.5
    runs: Counter[str] = Counter()
    holding, release, let_other_end = threading.Event(), threading.Event(), threading.Event()
    with effect_db(dsn) as connect:

        @app.task(max_attempts=3)
        def slow_commit(ctx: Context) -> str:
            runs["slow_commit"] += 1
            # Progress left for the lease keeper to write (one a second is written at
            # once): it must not make the keeper wait for the held row either.
            ctx.progress(0.5, "packing")
            ctx.progress(0.9, "shipping")
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, "held")
                ctx.complete(conn, result="committed")
                holding.set()
                release.wait(DEADLINE * 3)
                conn.commit()
            finally:
                conn.close()
            return "not recorded"

        @app.task(max_attempts=3)
        def other(ctx: Context) -> str:
            runs["other"] += 1
            let_other_end.wait(DEADLINE * 3)
            return "other"

        # The bystander first: the older lease, met first by a rescue.
        bystander = other.enqueue()
        held = slow_commit.enqueue()
        # Another process's maintenance, rescuing as often as a worker's does.
        rescuer = open_store(dsn)
        stop_rescuing = threading.Event()
        rescued: list[int] = []
        rounds = Counter[str]()

        def rescue_loop() -> None:
            while not stop_rescuing.wait(round_interval(lease)):
                with suppress(Exception):  # a locked database: the next round tries again
                    rescued.extend(rescuer.job_rescue_expired())
                rounds["done"] += 1

        def rounds_pass(count: int) -> None:
            until = rounds["done"] + count
            wait_until(lambda: rounds["done"] >= until, what=f"{count} rescue rounds")

        with app.worker(concurrency=2, lease=lease, poll_interval=0.05) as worker:
            assert holding.wait(DEADLINE)
            wait_until(lambda: app.get(bystander.id).state == JobState.RUNNING)
            rescuing = threading.Thread(target=rescue_loop)
            rescuing.start()
            try:
                # Held until the bystander's lease would have lapsed twice over unrenewed.
                expires = app.get(bystander.id).lease_expires_at
                assert expires is not None
                wait_until(
                    lambda: utcnow() > expires + timedelta(seconds=lease),
                    timeout=DEADLINE * 2,
                    what="the hold outlasted the lease",
                )
                release.set()
                app.wait(held.id, timeout=DEADLINE)
                # The bystander still runs, through rounds of rescue after the commit.
                rounds_pass(4)
                let_other_end.set()
                app.wait(bystander.id, timeout=DEADLINE)
                wait_until(lambda: sum(worker.counts.values()) >= 2)
            finally:
                release.set()
                let_other_end.set()
                stop_rescuing.set()
                rescuing.join(timeout=DEADLINE * 4)
                rescuer.close()
        assert kinds(app, held.id) == ["enqueued", "claimed", "succeeded"]
        assert app.get(held.id).result == "committed"
        assert rescued == []
        assert kinds(app, bystander.id) == ["enqueued", "claimed", "succeeded"]
        assert runs == {"slow_commit": 1, "other": 1}
        assert worker.counts["succeeded"] == 2 and worker.counts["lost"] == 0


@sql_only
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_complete_committed_after_the_handler_returned_is_recorded_once(
    app: App, dsn: str, commit: bool
) -> None:
    """The handler returns while its transaction is still open (committed by another thread
    later): the worker's finish of that job waits for nothing, and what the transaction
    decides is what the job records, counted once."""
    handed: list[Any] = []
    returned, release = threading.Event(), threading.Event()
    with effect_db(dsn):

        @app.task(max_attempts=1)
        def ship(ctx: Context) -> str:
            ctx.progress(0.5, "packing")
            ctx.progress(0.9, "shipping")  # left for the worker to write
            conn = connect_shared(dsn)
            insert_effect(conn, ctx.job_id, "shipped")
            ctx.complete(conn, result="in the transaction")
            handed.append(conn)  # the commit is someone else's now
            returned.set()
            return "returned"

        @app.task
        def quick(ctx: Context) -> str:
            returned.wait(DEADLINE)
            return "quick"

        def end_it() -> None:
            release.wait(DEADLINE * 3)
            conn = handed[0]
            conn.commit() if commit else conn.rollback()
            conn.close()

        ending = threading.Thread(target=end_it)
        ending.start()
        try:
            with app.worker(concurrency=2, lease=1.5, poll_interval=0.05) as worker:
                job = ship.enqueue()
                bystander = quick.enqueue()
                assert returned.wait(DEADLINE)
                if not dsn.startswith("sqlite"):
                    # Not held back by the open transaction (SQLite: its write lock is).
                    app.wait(bystander.id, timeout=DEADLINE)
                    assert app.get(job.id).state == JobState.RUNNING
                release.set()
                app.wait(job.id, timeout=DEADLINE)
                app.wait(bystander.id, timeout=DEADLINE)
                wait_until(lambda: sum(worker.counts.values()) == 2)
                assert worker.counts["succeeded"] == 2 and worker.counts["lost"] == 0
        finally:
            release.set()
            ending.join(timeout=DEADLINE)
    expected = "in the transaction" if commit else "returned"
    assert app.get(job.id).result == expected
    assert kinds(app, job.id) == ["enqueued", "claimed", "succeeded"]
