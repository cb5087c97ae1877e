"""The client API on both backends: enqueue, options, inspection, operations, waiting."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conveyor import (
    App,
    ConfigurationError,
    InvalidJobError,
    JobCancelled,
    JobFailed,
    JobNotFoundError,
    JobState,
    JobStateError,
    UnknownTaskError,
)
from conveyor.job import MAX_NAME_LENGTH, MAX_PAYLOAD_BYTES, utcnow
from conveyor.store.records import Finish, Lease
from outcomes import Failure, cancelled


def test_enqueue_and_get(app: App) -> None:
    @app.task(queue="math", max_attempts=4, priority=2)
    def add(a: int, b: int) -> int:
        return a + b

    job = add.enqueue(1, 2)
    assert job.task == "add"
    assert job.queue == "math"
    assert job.max_attempts == 4
    assert job.priority == 2
    assert job.state == JobState.QUEUED
    again = app.get(job.id)
    assert again.args == [1, 2]
    assert again.kwargs == {}
    assert again.state == JobState.QUEUED
    assert add(2, 3) == 5  # a task stays callable as a plain function


def test_options_never_come_from_task_kwargs(app: App) -> None:
    @app.task
    def send(key: str, delay: int, group: str) -> None: ...

    job = send.enqueue(key="k", delay=5, group="g")
    assert job.kwargs == {"key": "k", "delay": 5, "group": "g"}
    assert job.key is None
    assert job.group is None
    assert job.run_at <= utcnow()


def test_options_apply_to_one_enqueue(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    before = utcnow()
    job = add.options(
        key="k1", group="g1", priority=5, delay=10, queue="other", max_attempts=5, batch="b1"
    ).enqueue(1, 2)
    assert (job.key, job.group, job.priority, job.queue, job.max_attempts, job.batch) == (
        "k1",
        "g1",
        5,
        "other",
        5,
        "b1",
    )
    assert job.run_at >= before + timedelta(seconds=10)
    plain = add.enqueue(3, 4)
    assert (plain.key, plain.group, plain.priority, plain.queue) == (None, None, 0, "default")


def test_run_at_option(app: App) -> None:
    @app.task
    def noop() -> None: ...

    when = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    job = noop.options(run_at=when).enqueue()
    assert app.get(job.id).run_at == when
    with pytest.raises(InvalidJobError, match="timezone-aware"):
        noop.options(run_at=datetime(2030, 1, 1)).enqueue()
    with pytest.raises(InvalidJobError, match="either delay or run_at"):
        noop.options(run_at=when, delay=1).enqueue()


def test_same_key_returns_the_live_job(app: App) -> None:
    @app.task
    def ping() -> None: ...

    first = ping.options(key="once").enqueue()
    second = ping.options(key="once").enqueue()
    assert second.id == first.id
    assert len(app.jobs()) == 1


def test_enqueue_many_is_one_transaction(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    jobs = add.enqueue_many([((1, 2), {}), ((3, 4), {}), ((), {"a": 5, "b": 6})])
    assert [j.args for j in jobs] == [[1, 2], [3, 4], []]
    assert jobs[2].kwargs == {"a": 5, "b": 6}
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    # One bad call refuses the whole batch and writes nothing.
    with pytest.raises(InvalidJobError):
        add.enqueue_many([((1, 2), {}), ((object(), 2), {})])
    assert len(app.jobs()) == 3


def test_enqueue_by_name_without_the_handler(app: App) -> None:
    job = app.enqueue("remote.resize", args=[1], kwargs={"w": 2}, queue="img", key="r1")
    assert (job.task, job.queue, job.key, job.args, job.kwargs) == (
        "remote.resize",
        "img",
        "r1",
        [1],
        {"w": 2},
    )


def test_enqueue_by_name_uses_registered_defaults(app: App) -> None:
    @app.task(queue="mail", max_attempts=7)
    def send() -> None: ...

    job = app.enqueue("send")
    assert (job.queue, job.max_attempts) == ("mail", 7)


# --- bad input: a clear error, and nothing written ----------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ([object()], {}, "JSON-serialisable"),
        ([float("nan")], {}, "JSON-serialisable"),
        ([], {"when": datetime(2020, 1, 1)}, "JSON-serialisable"),
        ("notalist", {}, "args must be a list"),
        ([], {1: "x"}, "kwargs keys must be strings"),
    ],
)
def test_unencodable_payload_is_refused(
    app: App, args: object, kwargs: dict[object, object], message: str
) -> None:
    with pytest.raises(InvalidJobError, match=message):
        app.enqueue("t", args=args, kwargs=kwargs)  # type: ignore[arg-type]
    assert app.jobs() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [({"queue": "a\x00b"}, "NUL"), ({"key": "k\ud800"}, "surrogate"), ({"group": " "}, "empty")],
)
def test_unstorable_names_are_refused(app: App, options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        app.enqueue("t", **options)  # type: ignore[arg-type]
    assert app.jobs() == []


def test_payload_size_limit(app: App) -> None:
    with pytest.raises(InvalidJobError, match="limit is"):
        app.enqueue("t", args=["x" * (MAX_PAYLOAD_BYTES + 1)])
    assert app.jobs() == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": ""}, "queue must not be empty"),
        ({"queue": "q" * (MAX_NAME_LENGTH + 1)}, "the limit is"),
        ({"delay": -1}, "delay must be"),
        ({"delay": float("inf")}, "delay must be"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"priority": 2**40}, "priority"),
        ({"key": ""}, "key must not be empty"),
    ],
)
def test_bad_options_are_refused(app: App, options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        app.enqueue("t", **options)
    assert app.jobs() == []


def test_bad_task_names(app: App) -> None:
    with pytest.raises(InvalidJobError, match="task name must not be empty"):
        app.enqueue("")
    with pytest.raises(InvalidJobError, match="the limit is"):
        app.enqueue("t" * (MAX_NAME_LENGTH + 1))
    with pytest.raises(UnknownTaskError, match="no task named 'missing'"):
        app.get_task("missing")
    assert app.jobs() == []


def test_unknown_enqueue_option(app: App) -> None:
    @app.task
    def noop() -> None: ...

    with pytest.raises(InvalidJobError, match="unknown enqueue option"):
        noop.options(dealy=3)


def test_arguments_that_do_not_fit_the_handler(app: App) -> None:
    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(InvalidJobError, match="arguments do not fit task 'add'"):
        add.enqueue(1, 2, 3)  # type: ignore[call-arg]
    with pytest.raises(InvalidJobError, match="arguments do not fit"):
        add.enqueue(1, c=2)  # type: ignore[call-arg]
    assert app.jobs() == []


def test_duplicate_task_name(app: App) -> None:
    @app.task
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match="already registered"):

        @app.task(name="job")
        def other() -> None: ...


# --- inspecting and operating --------------------------------------------------


def test_get_missing_job(app: App) -> None:
    with pytest.raises(JobNotFoundError, match="no job with id 999"):
        app.get(999)


def test_jobs_filters_and_pages(app: App) -> None:
    for i in range(5):
        app.enqueue("a", args=[i], queue="q1")
    for i in range(3):
        app.enqueue("b", args=[i], queue="q2", batch="bt")
    assert len(app.jobs()) == 8
    assert {j.task for j in app.jobs(queue="q2")} == {"b"}
    assert len(app.jobs(task="a")) == 5
    assert len(app.jobs(batch="bt")) == 3
    first_page = app.jobs(limit=3)
    second_page = app.jobs(limit=3, before_id=first_page[-1].id)
    assert [j.id for j in first_page + second_page] == sorted(
        (j.id for j in app.jobs()), reverse=True
    )[:6]


def test_cancel_retry_and_events(app: App) -> None:
    job = app.enqueue("t")
    assert app.cancel(job.id).state == JobState.CANCELLED
    retried = app.retry(job.id)
    assert retried.state == JobState.QUEUED
    assert [e.kind for e in app.events(job.id)] == ["enqueued", "cancelled", "manual_retry"]
    with pytest.raises(JobStateError, match="only failed or cancelled"):
        app.retry(job.id)
    with pytest.raises(JobNotFoundError):
        app.cancel(12345)


def test_pause_resume_and_stats(app: App) -> None:
    app.enqueue("t", queue="a")
    app.enqueue("t", queue="a")
    app.enqueue("t", queue="b")
    app.pause("b")
    stats = app.stats()
    assert stats.queues["a"].counts == {"queued": 2}
    assert stats.queues["b"].paused
    assert not stats.queues["a"].paused
    assert stats.count("queued") == 3
    assert stats.queues["a"].oldest_ready_age is not None
    app.resume("b")
    assert not app.stats().queues["b"].paused


def test_purge_deletes_old_terminal_jobs(app: App) -> None:
    done = app.enqueue("t")
    app.enqueue("t")  # stays queued
    app.cancel(done.id)
    assert app.purge(older_than=timedelta(days=1)) == 0
    assert app.purge(older_than=timedelta(0)) == 1
    with pytest.raises(JobNotFoundError):
        app.get(done.id)
    assert len(app.jobs()) == 1


def test_health(app: App) -> None:
    health = app.health()
    assert health["ok"] is True
    assert health["schema_version"] >= 1


# --- waiting for a result -------------------------------------------------------


def _finish_later(app: App, job_id: int, outcome: str) -> threading.Thread:
    """Play a worker: claim the job and end it a little later."""

    def run() -> None:
        now = utcnow()
        (claimed,) = app.store.job_claim(["default"], 1, "w1", timedelta(seconds=30), now)
        assert claimed.id == job_id and claimed.lease_token is not None
        if outcome == "succeed":
            app.store.job_finish(
                [Finish.complete(job_id, claimed.lease_token, '{"x": 1}')], utcnow()
            )
        elif outcome == "fail":
            failure = Failure(job_id, claimed.lease_token, "Traceback: boom", now, retryable=False)
            app.store.job_finish([failure], utcnow())
        else:
            app.cancel(job_id)
            app.store.job_finish(cancelled([Lease(job_id, claimed.lease_token)]), utcnow())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_wait_returns_the_result(app: App) -> None:
    job = app.enqueue("t")
    thread = _finish_later(app, job.id, "succeed")
    assert job.wait(timeout=10) == {"x": 1}
    thread.join()


def test_wait_raises_the_remote_error(app: App) -> None:
    job = app.enqueue("t")
    thread = _finish_later(app, job.id, "fail")
    with pytest.raises(JobFailed, match="boom") as info:
        job.wait(timeout=10)
    assert info.value.error == "Traceback: boom"
    thread.join()


def test_wait_raises_cancelled(app: App) -> None:
    job = app.enqueue("t")
    thread = _finish_later(app, job.id, "cancel")
    with pytest.raises(JobCancelled):
        job.wait(timeout=10)
    thread.join()


def test_wait_times_out(app: App) -> None:
    job = app.enqueue("t")
    with pytest.raises(TimeoutError, match="still queued"):
        job.wait(timeout=0.05)


async def _await_result(app: App, job_id: int) -> object:
    job = await app.aget(job_id)
    return await job.await_result(timeout=10)


def test_async_twins(app: App) -> None:
    import asyncio

    job = asyncio.run(app.aenqueue("t", args=[1]))
    assert app.get(job.id).args == [1]
    thread = _finish_later(app, job.id, "succeed")
    assert asyncio.run(_await_result(app, job.id)) == {"x": 1}
    thread.join()


def test_async_twins_of_reading_and_operating(app: App) -> None:
    import asyncio
    from datetime import timedelta

    async def scenario() -> None:
        first = await app.aenqueue("t", args=[1], batch="b")
        second = await app.aenqueue("t", args=[2], batch="b", queue="other")
        assert [j.id for j in await app.ajobs(queue="other")] == [second.id]
        assert (await app.astats()).count("queued") == 2
        assert (await app.abatch_status("b")).outstanding == 2
        assert (await app.acancel(first.id)).state == JobState.CANCELLED
        assert [e.kind for e in await app.aevents(first.id)] == ["enqueued", "cancelled"]
        assert (await app.aretry(first.id)).state == JobState.QUEUED
        await app.apause("other")
        assert (await app.astats()).queues["other"].paused
        await app.aresume("other")
        assert not (await app.astats()).queues["other"].paused
        await app.acancel(second.id)
        assert await app.apurge(timedelta(0)) == 1
        assert [j.id for j in await app.ajobs()] == [first.id]

    asyncio.run(scenario())


# --- DSNs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("mysql://localhost/db", "unsupported DSN"),
        ("jobs.db", "unsupported DSN"),
        ("sqlite://jobs.db", "malformed SQLite DSN"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "in-memory"),
        ("postgresql://localhost:notaport/db", "port is not a number"),
        ("postgresql://localhost:5432", "names no database"),
        ("sqlite:////nonexistent-dir/x/jobs.db", "does not exist"),
    ],
)
def test_malformed_dsn(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        App(dsn)


def test_password_is_not_shown_in_errors() -> None:
    with pytest.raises(ConfigurationError) as info:
        App("mysql://user:secret@host/db")
    assert "secret" not in str(info.value)


def test_default_dsn_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONVEYOR_DSN", f"sqlite:///{tmp_path / 'env.db'}")
    with App() as app:
        app.enqueue("t")
    assert (tmp_path / "env.db").exists()


def test_default_dsn_is_conveyor_db_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONVEYOR_DSN", raising=False)
    monkeypatch.chdir(tmp_path)
    with App() as app:
        app.enqueue("t")
    assert (tmp_path / "conveyor.db").exists()


# --- enqueueing inside the caller's own transaction ---------------------------


def test_enqueue_in_caller_transaction_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with App(f"sqlite:///{path}") as app:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)")
        # Rolled back: neither the order nor its job exists.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (item) VALUES ('book')")
        app.enqueue("ship", args=["book"], connection=conn)
        conn.execute("ROLLBACK")
        assert app.jobs() == []
        # Committed: both exist.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO orders (item) VALUES ('pen')")
        job = app.enqueue("ship", args=["pen"], connection=conn)
        conn.execute("COMMIT")
        assert app.get(job.id).args == ["pen"]
        assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
        conn.close()


def test_enqueue_in_caller_transaction_needs_a_transaction(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with App(f"sqlite:///{path}") as app:
        conn = sqlite3.connect(path, isolation_level=None)
        with pytest.raises(ConfigurationError, match="open transaction"):
            app.enqueue("ship", connection=conn)
        conn.close()


def test_enqueue_in_caller_transaction_postgres(pg_clean_dsn: str) -> None:
    import psycopg

    with App(pg_clean_dsn) as app:
        app.migrate()
        with psycopg.connect(pg_clean_dsn) as conn:
            conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, item text)")
            conn.commit()
            app.enqueue("ship", args=["book"], connection=conn)
            conn.execute("INSERT INTO orders (item) VALUES ('book')")
            assert app.jobs() == []  # not visible before the caller commits
            conn.rollback()
            assert app.jobs() == []
            job = app.enqueue("ship", args=["pen"], connection=conn)
            conn.execute("INSERT INTO orders (item) VALUES ('pen')")
            conn.commit()
        assert json.loads(app.get(job.id).args_json) == ["pen"]


def test_unreachable_postgres_names_host_and_port() -> None:
    from conveyor import StoreUnavailableError

    with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1:1"):
        App("postgresql://postgres@127.0.0.1:1/nothing", connect_timeout=2)
