"""Exactly-once effects: ctx.complete in the handler's own transaction, and durable steps.

Run through the testing helpers (drain, inline), on real databases: the
effect table is a table of the queue's own database, written on a connection
of the test's own, as a user's handler would.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, Context, FixedBackoff, JobState
from conveyor.cli import cli
from conveyor.errors import ConfigurationError, LeaseLostError
from conveyor.job import NewJob, utcnow
from conveyor.store.records import Finish, Lease, NewStep
from conveyor.testing import drain, inline
from conveyor.web import create_app
from store_fixtures import sql_only
from waiting import wait_until


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


@contextmanager
def effect_db(dsn: str) -> Iterator[Callable[[], Any]]:
    """A function that opens a new connection to the queue's database; the effects table made."""
    if dsn.startswith("sqlite"):
        path = dsn.removeprefix("sqlite:///")

        def connect_sqlite() -> Any:
            return sqlite3.connect(path, timeout=30)

        with closing(connect_sqlite()) as conn:
            conn.execute("CREATE TABLE effects (job_id INTEGER PRIMARY KEY, note TEXT)")
            conn.commit()
        yield connect_sqlite
    else:

        def connect_pg() -> Any:
            return psycopg.connect(dsn)

        with connect_pg() as conn:
            conn.execute("CREATE TABLE effects (job_id bigint PRIMARY KEY, note text)")
        yield connect_pg


def effect_rows(connect: Callable[[], Any]) -> list[tuple[Any, ...]]:
    conn = connect()
    try:
        return list(conn.execute("SELECT job_id, note FROM effects ORDER BY job_id").fetchall())
    finally:
        conn.close()


def insert_effect(conn: Any, job_id: int, note: str) -> None:
    mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(f"INSERT INTO effects (job_id, note) VALUES ({mark}, {mark})", (job_id, note))


# --- ctx.complete ---------------------------------------------------------------------


@sql_only
def test_complete_commits_the_effect_and_the_success_together(app: App, dsn: str) -> None:
    with effect_db(dsn) as connect:

        @app.task
        def ship(ctx: Context, order: str) -> str:
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, order)
                ctx.complete(conn, result={"shipped": order})
                conn.commit()
            finally:
                conn.close()
            return "not recorded: the job succeeded in the handler's transaction"

        job = ship.enqueue("book")
        counts = drain(app)
        assert counts == {"succeeded": 1}, app.get(job.id).error
        done = app.get(job.id)
        assert done.state == JobState.SUCCEEDED
        assert done.result == {"shipped": "book"}
        assert done.finished_at is not None and done.lease_token is None
        assert kinds(app, job.id) == ["enqueued", "claimed", "succeeded"]
        assert effect_rows(connect) == [(job.id, "book")]


@sql_only
def test_a_rolled_back_complete_leaves_neither_and_the_handler_outcome_counts(
    app: App, dsn: str
) -> None:
    with effect_db(dsn) as connect:

        @app.task(max_attempts=2, backoff=FixedBackoff(3600))
        def ship(ctx: Context) -> str:
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, f"attempt {ctx.attempt}")
                ctx.complete(conn, result="from complete")
                conn.rollback()
            finally:
                conn.close()
            if ctx.attempt == 1:
                raise RuntimeError("rolled back, then failed")
            return "returned"

        job = ship.enqueue()
        assert drain(app) == {"retried": 1}
        assert app.get(job.id).state == JobState.QUEUED
        assert effect_rows(connect) == []
        assert drain(app, with_scheduled=True) == {"succeeded": 1}
        done = app.get(job.id)
        assert done.result == "returned" and done.attempts == 2
        assert kinds(app, job.id).count("succeeded") == 1
        assert effect_rows(connect) == []


@sql_only
def test_complete_after_the_lease_is_lost_raises_and_writes_nothing(app: App, dsn: str) -> None:
    with effect_db(dsn) as connect:
        raised: list[str] = []

        @app.task
        def ship(ctx: Context) -> str:
            # An operator takes the job back (as a rescue would, once the lease ran out).
            app.take_back([ctx.job_id])
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, "late")
                with pytest.raises(LeaseLostError, match="lease was lost") as caught:
                    ctx.complete(conn, result="late")
                raised.append(str(caught.value))
                conn.rollback()
            finally:
                conn.close()
            return "late"

        job = ship.enqueue()
        assert drain(app, limit=1) == {"lost": 1}
        assert raised
        back = app.get(job.id)
        assert back.state == JobState.QUEUED and back.result is None
        assert "succeeded" not in kinds(app, job.id)
        assert effect_rows(connect) == []


@sql_only
def test_complete_refuses_a_connection_it_cannot_join(app: App, dsn: str, tmp_path: Path) -> None:
    errors: list[str] = []

    @app.task
    def ship(ctx: Context) -> None:
        for conn in (object(), sqlite3.connect(tmp_path / "other.db")):
            with pytest.raises(ConfigurationError) as caught:
                ctx.complete(conn)
            errors.append(str(caught.value))
        if dsn.startswith("sqlite"):
            idle = sqlite3.connect(dsn.removeprefix("sqlite:///"))
            with pytest.raises(ConfigurationError, match="open transaction") as caught:
                ctx.complete(idle)  # no transaction open on it: nothing to join
            errors.append(str(caught.value))
            idle.close()
        else:
            with psycopg.connect(dsn, autocommit=True) as auto:
                with pytest.raises(ConfigurationError, match="open transaction"):
                    ctx.complete(auto)
                with auto.transaction():  # an explicit block on an autocommit connection joins
                    ctx.complete(auto, result="joined")

    job = ship.enqueue()
    drain(app)
    assert len(errors) >= 2 and all("ctx.complete needs" in e for e in errors)
    done = app.get(job.id)
    if dsn.startswith("sqlite"):
        assert done.state == JobState.SUCCEEDED and done.result is None
    else:
        assert done.state == JobState.SUCCEEDED and done.result == "joined"
    assert kinds(app, job.id).count("succeeded") == 1


def test_complete_is_refused_on_redis(redis_clean_dsn: str) -> None:
    seen: list[str] = []
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task
        def ship(ctx: Context) -> str:
            with pytest.raises(ConfigurationError) as caught:
                ctx.complete(object(), result=1)
            seen.append(str(caught.value))
            return "returned"

        job = ship.enqueue()
        assert drain(app) == {"succeeded": 1}
        assert app.get(job.id).result == "returned"
    assert "Redis" in seen[0] and "only the SQL stores" in seen[0]


@sql_only
def test_complete_in_inline_mode(app: App, dsn: str) -> None:
    with effect_db(dsn) as connect:

        @app.task
        def ship(ctx: Context, n: int) -> None:
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, str(n))
                ctx.complete(conn, result=n * 2)
                conn.commit()
            finally:
                conn.close()

        with inline(app):
            job = ship.enqueue(21)
        assert app.get(job.id).result == 42
        assert effect_rows(connect) == [(job.id, "21")]


# --- durable steps ------------------------------------------------------------------


def test_steps_return_recorded_results_on_later_attempts(app: App) -> None:
    calls: list[str] = []

    def charge(amount: int) -> dict[str, Any]:
        calls.append(f"charge {amount}")
        return {"charged": amount, "ids": (1, 2)}

    def email(to: str) -> str:
        calls.append(f"email {to}")
        return f"sent to {to}"

    @app.task(max_attempts=3, backoff=FixedBackoff(3600))
    def order(ctx: Context, amount: int) -> list[Any]:
        receipt = ctx.step("charge", charge, amount)
        if ctx.attempt == 1:
            raise RuntimeError("crashed after the charge")
        sent = ctx.step("email", email, to="ann@example.com")
        return [receipt, sent]

    job = order.enqueue(30)
    assert drain(app) == {"retried": 1}
    assert calls == ["charge 30"]
    assert drain(app, with_scheduled=True) == {"succeeded": 1}
    # The charge ran once; its recorded result (tuples as JSON lists) came back.
    assert calls == ["charge 30", "email ann@example.com"]
    assert app.get(job.id).result == [{"charged": 30, "ids": [1, 2]}, "sent to ann@example.com"]
    steps = app.steps(job.id)
    assert [(s.name, s.attempt) for s in steps] == [("charge", 1), ("email", 2)]
    assert steps[0].result == {"charged": 30, "ids": [1, 2]}
    assert all(s.started_at <= s.finished_at for s in steps)
    assert steps[0].finished_at <= steps[1].started_at


def test_a_step_that_raises_is_not_recorded_and_may_be_called_again(app: App) -> None:
    tries: list[int] = []

    def flaky() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("try again")
        return len(tries)

    @app.task
    def fetch(ctx: Context) -> int:
        for _ in range(5):
            try:
                value: int = ctx.step("fetch", flaky)
                return value
            except ConnectionError:
                continue
        return -1

    job = fetch.enqueue()
    assert drain(app) == {"succeeded": 1}
    assert app.get(job.id).result == 3
    assert [(s.name, s.result) for s in app.steps(job.id)] == [("fetch", 3)]


def test_step_rules_fail_the_job_with_a_clear_error(app: App) -> None:
    @app.task(max_attempts=5)
    def twice(ctx: Context) -> None:
        ctx.step("same", lambda: 1)
        ctx.step("same", lambda: 2)

    @app.task(max_attempts=5)
    def unstorable(ctx: Context) -> None:
        ctx.step("when", utcnow)

    @app.task(max_attempts=5)
    def unnamed(ctx: Context) -> None:
        ctx.step("", lambda: 1)

    ran_twice, not_json, empty = twice.enqueue(), unstorable.enqueue(), unnamed.enqueue()
    assert drain(app) == {"failed": 3}  # not retried: a retry would do the same again
    assert "ran twice in one attempt" in (app.get(ran_twice.id).error or "")
    assert "the result of step 'when' must be JSON-serialisable" in (
        app.get(not_json.id).error or ""
    )
    assert "step name must not be empty" in (app.get(empty.id).error or "")
    assert [s.name for s in app.steps(ran_twice.id)] == ["same"]


def test_async_handlers_await_astep(app: App) -> None:
    calls: list[str] = []

    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        calls.append(url)
        return f"body of {url}"

    def parse(body: str) -> int:
        calls.append("parse")
        return len(body)

    @app.task(max_attempts=2, backoff=FixedBackoff(3600))
    async def crawl(ctx: Context, url: str) -> int:
        body: str = await ctx.astep("fetch", fetch, url)
        size: int = await ctx.astep("parse", parse, body)
        if ctx.attempt == 1:
            raise RuntimeError("after both steps")
        return size

    @app.task(max_attempts=3)
    async def wrong(ctx: Context) -> None:
        ctx.step("fetch", fetch, "x")  # a coroutine function needs astep

    job, refused = crawl.enqueue("u"), wrong.enqueue()
    drain(app)
    drain(app, with_scheduled=True)
    assert app.get(job.id).result == len("body of u")
    assert calls == ["u", "parse"]
    failed = app.get(refused.id)
    assert "use `await ctx.astep(...)`" in (failed.error or "")
    assert (failed.state, failed.attempts) == ("failed", 1)  # not retried


def test_steps_are_deleted_with_their_job(app: App) -> None:
    @app.task
    def work(ctx: Context) -> int:
        return int(ctx.step("one", lambda: 1)) + int(ctx.step("two", lambda: 2))

    gone, kept = work.enqueue(), work.enqueue()
    drain(app)
    assert len(app.steps(gone.id)) == 2
    assert app.delete_jobs(ids=[gone.id]) == 1
    assert app.steps(gone.id) == []
    assert len(app.steps(kept.id)) == 2
    assert app.purge(older_than=timedelta(0)) >= 1
    assert app.steps(kept.id) == []


def test_a_step_after_the_lease_is_lost_is_not_recorded(app: App) -> None:
    calls: list[str] = []

    @app.task
    def work(ctx: Context) -> None:
        app.take_back([ctx.job_id])
        with pytest.raises(LeaseLostError, match="step 'late' ran but was not recorded"):
            ctx.step("late", lambda: calls.append("late"))

    job = work.enqueue()
    assert drain(app, limit=1) == {"lost": 1}
    assert calls == ["late"]
    assert app.steps(job.id) == []


@sql_only
def test_a_worker_records_nothing_more_after_a_committed_complete(app: App, dsn: str) -> None:
    with effect_db(dsn) as connect:

        @app.task(max_attempts=1)
        def ship(ctx: Context, commit: bool, then_raise: bool) -> str:
            conn = connect()
            try:
                insert_effect(conn, ctx.job_id, "shipped")
                ctx.complete(conn, result="in the transaction")
                conn.commit() if commit else conn.rollback()
            finally:
                conn.close()
            # Past a renewal of the lease, which finds the job no longer running.
            time.sleep(0.8)
            if then_raise:
                raise RuntimeError("after the commit: too late to change the outcome")
            return "returned"

        with app.worker(concurrency=3, lease=0.9, poll_interval=0.05) as worker:
            committed = ship.enqueue(True, False)
            raised = ship.enqueue(True, True)
            rolled_back = ship.enqueue(False, False)
            for job in (committed, raised, rolled_back):
                app.wait(job.id, timeout=10)
            wait_until(lambda: sum(worker.counts.values()) == 3)
            assert worker.counts["succeeded"] == 3 and worker.counts["lost"] == 0
        assert app.get(committed.id).result == "in the transaction"
        assert app.get(raised.id).result == "in the transaction"
        assert app.get(rolled_back.id).result == "returned"
        for job in (committed, raised, rolled_back):
            assert kinds(app, job.id) == ["enqueued", "claimed", "succeeded"]
        assert effect_rows(connect) == [(committed.id, "shipped"), (raised.id, "shipped")]


# --- where steps are shown ------------------------------------------------------------


def test_steps_appear_in_jobs_show_and_on_the_job_page(app: App, dsn: str) -> None:
    @app.task
    def order(ctx: Context) -> str:
        ctx.step("reserve stock", lambda: {"sku": "B-12", "left": 3})
        ctx.step("charge card", lambda: "ch_123")
        return "ok"

    job = order.enqueue()
    drain(app)

    result = CliRunner().invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert [(s["name"], s["attempt"], s["result"]) for s in shown["steps"]] == [
        ("reserve stock", 1, {"sku": "B-12", "left": 3}),
        ("charge card", 1, "ch_123"),
    ]
    assert all(s["started_at"] <= s["finished_at"] for s in shown["steps"])
    table = CliRunner().invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn]).stdout
    assert "Steps" in table and "reserve stock" in table and '"ch_123"' in table

    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{job.id}").text
    steps_panel = page[page.index('id="job-steps"') :]
    assert "reserve stock" in steps_panel and "charge card" in steps_panel
    assert "&#34;ch_123&#34;" in steps_panel or "&quot;ch_123&quot;" in steps_panel


def test_steps_in_inline_mode(app: App) -> None:
    calls: list[int] = []

    @app.task(max_attempts=2, backoff=FixedBackoff(0))
    def once(ctx: Context, n: int) -> int:
        value = int(ctx.step("square", lambda: calls.append(n) or n * n))
        if ctx.attempt == 1:
            raise RuntimeError("again")
        return value

    with inline(app):
        job = once.enqueue(7)
    assert app.get(job.id).result == 49
    assert calls == [7]
    assert [(s.name, s.attempt, s.result) for s in app.steps(job.id)] == [("square", 1, 49)]


@pytest.mark.parametrize("dsn", ["postgres"], indirect=True)
def test_a_committed_complete_notifies_waiters_and_workers(app: App, dsn: str) -> None:
    """PostgreSQL tells other processes as job_finish would: the job is done, its group is free."""
    with effect_db(dsn) as connect:

        @app.task
        def ship(ctx: Context) -> None:
            with connect() as conn:  # psycopg: commits at the end of the block
                insert_effect(conn, ctx.job_id, "x")
                ctx.complete(conn, result="done")

        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute("LISTEN conveyor_done")
            listener.execute("LISTEN conveyor_jobs")
            job = ship.options(group="g").enqueue()
            list(listener.notifies(timeout=0.5))  # the enqueue's own
            drain(app)
            heard = {(n.channel, n.payload) for n in listener.notifies(timeout=1, stop_after=2)}
        assert ("conveyor_done", str(job.id)) in heard
        assert ("conveyor_jobs", job.queue) in heard  # its group may let the next job through


# --- the store's side ----------------------------------------------------------------------


def claimed_lease(store: Any) -> Lease:
    now = utcnow()
    (job,) = store.job_insert_many([NewJob("q", "t", "[]", "{}", now)], now)
    (running,) = store.job_claim(["q"], 1, "w", timedelta(minutes=5))
    assert running.id == job.id and running.lease_token is not None
    return Lease(running.id, running.lease_token)


def test_the_store_records_steps_under_the_lease_and_keeps_the_first(store: Any) -> None:
    lease = claimed_lease(store)
    started = utcnow()
    first = store.step_record(lease, NewStep("a", '{"n": 1.5}', started))
    assert (first.name, first.result, first.attempt) == ("a", {"n": 1.5}, 1)
    assert first.started_at <= first.finished_at
    # Recorded already: kept, whatever the second result (one name, one result).
    again = store.step_record(lease, NewStep("a", '"other"', utcnow()))
    assert again.result == {"n": 1.5}
    store.step_record(lease, NewStep("b", "[1, 2]", utcnow()))
    assert [(s.name, s.result) for s in store.step_list(lease.id)] == [
        ("a", {"n": 1.5}),
        ("b", [1, 2]),
    ]
    assert store.step_list(lease.id + 1000) == []
    # A stale lease records nothing.
    assert store.job_finish([Finish.complete(lease.id, lease.token, "null")]) == [lease.id]
    assert store.step_record(lease, NewStep("c", "1", utcnow())) is None
    assert [s.name for s in store.step_list(lease.id)] == ["a", "b"]
    assert store.job_delete_many([lease.id]) == [lease.id]
    assert store.step_list(lease.id) == []


@sql_only
def test_the_store_completes_only_under_the_lease(store: Any, dsn: str) -> None:
    lease = claimed_lease(store)
    with effect_db(dsn) as connect:
        conn = connect()
        try:
            insert_effect(conn, lease.id, "stale")
            assert store.job_complete_in(Lease(lease.id, "not-the-token"), '"x"', conn) is False
            assert store.job_complete_in(lease, '{"ok": true}', conn) is True
            # Not committed: others still see it running.
            assert store.job_get(lease.id).state == JobState.RUNNING
            conn.commit()
        finally:
            conn.close()
    done = store.job_get(lease.id)
    assert (done.state, done.result, done.lease_token) == (JobState.SUCCEEDED, {"ok": True}, None)
    assert [e.kind for e in store.event_list(lease.id)] == ["enqueued", "claimed", "succeeded"]
    assert store.job_finish([Finish.complete(lease.id, lease.token, "null")]) == []
