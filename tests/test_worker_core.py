"""The worker core's promises, each tried as an adversary would, on both backends.

Idle means idle, each duty on its own, every job ends, one attempt at a time,
transient errors delay and never decide, periodic ticks once, a pull API as
robust as the worker, one clock, progress and cancel in process.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from conveyor import App, Context, FixedBackoff, JobCancelled, JobFailed, JobState, Retry
from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import MAX_JSON_DEPTH, NewJob, utcnow
from conveyor.schedule import Every
from conveyor.store.postgres import listener as pg_listener
from conveyor.worker.maintenance import Maintenance
from outcomes import purge
from waiting import wait_until

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


class Counting:
    """Counts calls of one store method (the store itself runs as usual)."""

    def __init__(self, app: App, name: str, fail: BaseException | None = None) -> None:
        self.calls = 0
        self.fail = fail
        self._original = getattr(app.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.fail is not None:
                raise self.fail
            return self._original(*args, **kwargs)

        setattr(app.store, name, counted)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# --- idle means idle -----------------------------------------------------------------


@pytest.mark.parametrize("held_by", ["busy group", "paused queue"])
def test_an_idle_worker_sleeps_beside_jobs_it_may_not_claim(app: App, held_by: str) -> None:
    release = threading.Event()

    @app.task(queue="chat")
    def hold() -> None:
        release.wait(DEADLINE)

    try:
        if held_by == "busy group":
            head = hold.options(group="g").enqueue()
            hold.options(group="g").enqueue()  # ready, but its group is busy
        else:
            app.pause("chat")
            hold.enqueue()
        with app.worker(concurrency=4, poll_interval=0.5, maintenance=False):
            if held_by == "busy group":
                wait_until(lambda: app.get(head.id).state == JobState.RUNNING)
            claims = Counting(app, "job_claim")
            time.sleep(1.2)  # past the SQLite watch's quick spell after activity
            cpu = time.process_time()
            time.sleep(2.0)
            cpu = time.process_time() - cpu
            release.set()
        # The fallback poll (0.5 s) and a wake or two; before, thousands a second.
        assert claims.calls <= 10, claims.calls
        # The whole test process, idle worker and all: under 5% of a core.
        assert cpu < 0.1, f"{cpu:.3f}s of CPU in 2s idle"
    finally:
        release.set()


def test_a_group_frees_its_next_job_at_once(app: App) -> None:
    order: list[str] = []

    @app.task(queue="chat")
    def step(name: str) -> None:
        order.append(name)
        time.sleep(0.05)

    with app.worker(concurrency=4, poll_interval=30, maintenance=False):
        jobs = [step.options(group="g").enqueue(n) for n in "abc"]
        started = time.monotonic()
        for job in jobs:
            job.wait(timeout=DEADLINE)
        # With a 30 s poll, only the group's own wake-ups can make this quick.
        assert time.monotonic() - started < 3.0
    assert order == ["a", "b", "c"]


# --- each duty on its own ----------------------------------------------------------------


def test_a_failing_claim_never_stops_lease_renewal(app: App) -> None:
    release = threading.Event()

    @app.task
    def long() -> str:
        release.wait(DEADLINE)
        return "done"

    try:
        with app.worker(concurrency=2, lease=0.9, poll_interval=0.05) as worker:
            job = long.enqueue()
            first = wait_until(lambda: (j := app.get(job.id)).state == JobState.RUNNING and j)
            claims = Counting(app, "job_claim", fail=RuntimeError("claims are broken"))
            time.sleep(2.0)  # more than two leases
            now = app.get(job.id)
            assert now.state == JobState.RUNNING
            assert now.lease_token == first.lease_token  # never rescued
            assert now.lease_expires_at is not None and first.lease_expires_at is not None
            assert now.lease_expires_at > first.lease_expires_at
            # The failing duty backs off: no hot loop.
            assert 1 <= claims.calls <= 40, claims.calls
            release.set()
            assert job.wait(timeout=DEADLINE) == "done"
            wait_until(lambda: worker.counts["succeeded"] == 1)
    finally:
        release.set()


# --- every job ends --------------------------------------------------------------------


def test_outcomes_that_cannot_be_made_end_their_jobs(app: App) -> None:
    @app.task(max_attempts=2)
    def retry_timedelta(ctx: Context) -> int:
        if ctx.attempt == 1 and not hasattr(retry_timedelta, "seen"):
            retry_timedelta.seen = True  # type: ignore[attr-defined]
            raise Retry(delay=timedelta(seconds=0.1))
        return ctx.attempt

    @app.task
    def retry_forever() -> None:
        raise Retry(delay=1e12)

    @app.task
    def deep_result() -> Any:
        return nested(5_000)

    with app.worker(concurrency=4, maintenance=False):
        snoozed = retry_timedelta.enqueue()
        far = retry_forever.enqueue()
        deep = deep_result.enqueue()
        assert snoozed.wait(timeout=DEADLINE) == 1
        with pytest.raises(JobFailed, match="past the year 9999"):
            far.wait(timeout=DEADLINE)
        with pytest.raises(JobFailed, match="nested too deeply"):
            deep.wait(timeout=DEADLINE)
    assert app.get(far.id).attempts == 1  # failed for good, not retried
    assert app.get(deep.id).attempts == 1


def test_a_poison_payload_fails_alone_and_its_claim_batch_runs(app: App) -> None:
    @app.task
    def echo(x: Any) -> Any:
        return x

    # Written around the App's checks, as another producer might.
    deep = "[" + "[" * 3_000 + "1" + "]" * 3_000 + "]"
    bad = NewJob("default", "echo", deep, "{}", utcnow())
    good = [NewJob("default", "echo", json.dumps([n]), "{}", utcnow()) for n in range(3)]
    jobs = app.store.job_insert_many([good[0], bad, good[1], good[2]], utcnow())
    with app.worker(concurrency=8, maintenance=False):
        results = [app.wait(j.id, timeout=DEADLINE) for j in jobs if j.id != jobs[1].id]
        with pytest.raises(JobFailed, match="undecodable payload"):
            app.wait(jobs[1].id, timeout=DEADLINE)
    assert results == [0, 1, 2]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_at": datetime(9999, 12, 31, tzinfo=UTC)}, "too far ahead"),
        ({"run_at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-14)))}, "out of range"),
        ({"delay": 1e12}, "too long"),
        ({"delay": timedelta.max}, "too long"),
        ({"max_attempts": 2**31}, "max_attempts"),
    ],
)
def test_enqueue_refuses_what_it_could_not_read_back(
    app: App, options: dict[str, Any], message: str
) -> None:
    @app.task
    def noop() -> None:
        return None

    entry_points: list[Callable[[], Any]] = [
        lambda: app.enqueue("noop", **options),
        lambda: noop.options(**options).enqueue(),
        lambda: noop.options(**options).enqueue_many([((), {})]),
    ]
    for enqueue in entry_points:
        with pytest.raises(InvalidJobError, match=message):
            enqueue()
    assert app.jobs() == []


def test_enqueue_refuses_payloads_nested_too_deep_on_every_entry_point(app: App) -> None:
    @app.task
    def echo(x: Any) -> Any:
        return x

    deep = nested(MAX_JSON_DEPTH + 5)
    with pytest.raises(InvalidJobError, match="nested"):
        echo.enqueue(deep)
    with pytest.raises(InvalidJobError, match="nested"):
        app.enqueue("echo", [nested(900)])
    with pytest.raises(InvalidJobError, match="nested"):
        app.enqueue_many([NewJob("default", "echo", json.dumps([deep]), "{}", utcnow())])
    with pytest.raises(InvalidJobError, match="max_attempts"):
        app.enqueue_many([NewJob("default", "echo", "[]", "{}", utcnow(), max_attempts=2**40)])
    assert app.jobs() == []
    assert echo.enqueue(nested(100)).id > 0  # deep, but readable


def test_bad_task_configuration_is_refused_when_declared(app: App) -> None:
    class Weird:
        def delay(self, attempt: int) -> Any:
            return timedelta(seconds=1)

    with pytest.raises(ConfigurationError, match="number of seconds"):
        app.task(lambda: None, name="a", backoff=Weird())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="delay"):
        app.task(lambda: None, name="b", backoff=object())  # type: ignore[arg-type]
    for timeout in (-1, 0, float("inf"), "10"):
        with pytest.raises(ConfigurationError, match="timeout"):
            app.task(lambda: None, name="c", timeout=timeout)  # type: ignore[arg-type]
    # A timedelta is understood wherever seconds are.
    task = app.task(
        lambda: None, name="d", backoff=FixedBackoff(timedelta(seconds=2)), timeout=timedelta(1)
    )
    assert task.backoff.delay(1) == 2.0 and task.timeout == 86400.0


# --- one attempt at a time -------------------------------------------------------------------


def test_a_timed_out_attempt_ends_before_the_next_starts(app: App) -> None:
    spans: list[tuple[int, float, float]] = []

    @app.task(timeout=0.2, max_attempts=2, backoff=FixedBackoff(0))
    def stubborn(ctx: Context) -> int:
        began = time.monotonic()
        if ctx.attempt == 1:
            time.sleep(0.8)  # ignores ctx.cancelled
        spans.append((ctx.attempt, began, time.monotonic()))
        return ctx.attempt

    with app.worker(concurrency=4, lease=5, maintenance=False):
        job = stubborn.enqueue()
        assert job.wait(timeout=DEADLINE) == 2
    (_, _, first_end), (_, second_start, _) = sorted(spans)
    assert second_start >= first_end


def test_a_cancelled_sync_handler_holds_its_group_until_it_returns(app: App) -> None:
    spans: dict[str, tuple[float, float]] = {}
    entered = threading.Event()

    @app.task(queue="chat")
    def step(name: str) -> str:
        began = time.monotonic()
        if name == "a":
            entered.set()
            time.sleep(0.8)  # ignores ctx.cancelled
        spans[name] = (began, time.monotonic())
        return name

    with app.worker(concurrency=4, lease=5, maintenance=False):
        first = step.options(group="g").enqueue("a")
        second = step.options(group="g").enqueue("b")
        assert entered.wait(DEADLINE)
        app.cancel(first.id)
        held = app.get(first.id)
        assert held.state == JobState.RUNNING and held.cancel_requested
        with pytest.raises(JobCancelled):
            first.wait(timeout=DEADLINE)
        assert second.wait(timeout=DEADLINE) == "b"
    assert spans["b"][0] >= spans["a"][1]


def test_a_cancel_in_this_process_reaches_the_handler_directly(app: App) -> None:
    seen = threading.Event()
    entered = threading.Event()

    @app.task
    async def waits(ctx: Context) -> None:
        entered.set()
        try:
            await asyncio.sleep(DEADLINE)
        finally:  # an async handler is cancelled outright
            seen.set()

    with app.worker(concurrency=2, poll_interval=30, maintenance=False):
        job = waits.enqueue()
        assert entered.wait(DEADLINE)
        gets = Counting(app, "job_get_many")
        asked = time.monotonic()
        app.cancel(job.id)
        assert seen.wait(DEADLINE)
        assert time.monotonic() - asked < 0.5
        with pytest.raises(JobCancelled):
            job.wait(timeout=DEADLINE)
    # On SQLite the file's change also wakes the worker, which may look; the
    # handler heard first either way.
    assert gets.calls <= 2


# --- progress ---------------------------------------------------------------------------


def test_progress_reaches_listeners_at_once_and_the_store_throttled(app: App) -> None:
    @app.task
    def busy(ctx: Context) -> None:
        for step in range(50):
            ctx.progress(step / 50, f"step {step}")
            time.sleep(0.01)

    heard: list[tuple[float | None, str | None]] = []
    with app.worker(concurrency=2, maintenance=False):
        writes = Counting(app, "job_progress")
        job = busy.enqueue()
        job.wait(timeout=DEADLINE, on_progress=lambda f, m: heard.append((f, m)))
    assert len(heard) >= 40  # the wait listened from the start; every call is heard
    assert heard[-1] == (49 / 50, "step 49")
    assert 1 <= writes.calls <= 3  # half a second of calls: once a second at most


# --- transient errors delay, never decide -------------------------------------------------


def test_a_success_survives_a_file_locked_past_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with App(f"sqlite:///{path}", busy_timeout=0.2) as app:
        started = threading.Event()
        go = threading.Event()

        @app.task
        def work() -> str:
            started.set()
            go.wait(DEADLINE)
            return "kept"

        with app.worker(concurrency=2, lease=5, maintenance=False):
            job = work.enqueue()
            assert started.wait(DEADLINE)
            locker = sqlite3.connect(path, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")  # a backup, a VACUUM, a long transaction
            go.set()
            time.sleep(1.0)  # five busy timeouts
            locker.execute("COMMIT")
            locker.close()
            assert job.wait(timeout=DEADLINE) == "kept"
        assert app.get(job.id).state == JobState.SUCCEEDED


# --- periodic ticks once ------------------------------------------------------------------


def test_a_periodic_tick_runs_once_across_purges_restarts_and_leaders(app: App) -> None:
    @app.periodic(every=timedelta(hours=1))
    def hourly() -> None:
        return None

    now = datetime(2026, 3, 1, 10, 30, tzinfo=UTC)
    Maintenance(app.runtime, "leader-1", lease=5).run_once(now)
    (job,) = app.jobs(task="hourly")
    assert job.run_at == datetime(2026, 3, 1, 10, tzinfo=UTC)
    claimed = app.store.job_claim(["default"], 1, "w", timedelta(seconds=30), now)
    app.store.job_finish([_complete(claimed[0])], now)
    assert purge(app.store, now + timedelta(days=8)) == 1  # retention took it
    # A restart, then another leader, within the same tick: nothing new.
    Maintenance(app.runtime, "leader-1", lease=5).run_once(now + timedelta(minutes=5))
    app.store.leader_release("maintenance", "leader-1")
    Maintenance(app.runtime, "leader-2", lease=5).run_once(now + timedelta(minutes=10))
    assert app.jobs(task="hourly") == []
    assert app.store.periodic_last_ticks() == {"hourly": datetime(2026, 3, 1, 10, tzinfo=UTC)}
    # The next tick runs.
    Maintenance(app.runtime, "leader-2", lease=5).run_once(now + timedelta(hours=1))
    (later,) = app.jobs(task="hourly")
    assert later.run_at == datetime(2026, 3, 1, 11, tzinfo=UTC)
    assert isinstance(app.periodic_tasks[0].schedule, Every)


def _complete(job: Any) -> Any:
    from conveyor.store.records import Finish

    return Finish.complete(job.id, job.lease_token, None)


# --- the pull API -------------------------------------------------------------------------


def test_consume_takes_back_a_dead_consumers_job_without_a_worker(app: App) -> None:
    job = app.enqueue("step", [1], queue="chat", group="g")
    nxt = app.enqueue("step", [2], queue="chat", group="g")
    # A consumer that claimed and died: its lease is never renewed.
    (dead,) = app.store.job_claim(["chat"], 1, "dead", timedelta(seconds=0.5), None)
    assert dead.id == job.id
    seen = []
    consumer = app.consume(["chat"], lease=5, poll_interval=0.1, idle_timeout=5)
    for held in consumer:
        with held:
            seen.append((held.id, held.attempts))
        if len(seen) == 2:
            break
    consumer.close()
    assert seen == [(job.id, 2), (nxt.id, 1)]
    assert [e.kind for e in app.events(job.id)].count("rescued") == 1


def test_consume_stops_from_another_thread_and_after_an_idle_timeout(app: App) -> None:
    consumer = app.consume(["nothing"], poll_interval=5)
    threading.Timer(0.2, consumer.stop).start()
    began = time.monotonic()
    assert list(consumer) == []
    assert time.monotonic() - began < 2.0
    began = time.monotonic()
    assert list(app.consume(["nothing"], poll_interval=5, idle_timeout=0.3)) == []
    assert 0.25 <= time.monotonic() - began < 2.0


def test_closing_the_app_releases_what_a_consumer_holds(dsn: str) -> None:
    app = App(dsn)
    app.migrate()
    job = app.enqueue("step", [1], queue="chat")
    consumer = app.consume(["chat"], lease=30)
    held = next(consumer)
    assert held.id == job.id
    app.close()
    with App(dsn) as other:
        again = other.get(job.id)
        assert again.state == JobState.QUEUED and again.attempts == 0
        assert [e.kind for e in other.events(job.id)][-1] == "released"


def test_consume_fails_a_poison_payload_at_once(app: App) -> None:
    bad = NewJob("chat", "step", '{"not": "an array"}', "{}", utcnow(), group="g")
    (poison,) = app.store.job_insert_many([bad], utcnow())
    good = app.enqueue("step", [2], queue="chat", group="g")
    consumer = app.consume(["chat"], lease=5, idle_timeout=2)
    held = next(consumer)
    assert held.id == good.id  # the group was not blocked
    held.complete()
    consumer.close()
    failed = app.get(poison.id)
    assert failed.state == JobState.FAILED and "undecodable payload" in (failed.error or "")


def test_aconsume_takes_an_idle_timeout(app: App) -> None:
    async def run() -> list[int]:
        return [job.id async for job in app.aconsume(["nothing"], idle_timeout=0.2)]

    assert asyncio.run(run()) == []


# --- the worker's own rules ------------------------------------------------------------------


def test_a_worker_cannot_be_started_twice(sqlite_store: Any) -> None:
    dsn, _ = sqlite_store
    with App(dsn) as app:

        @app.task
        def noop() -> None:
            return None

        worker = app.worker(maintenance=False)
        worker.start()
        try:
            with pytest.raises(RuntimeError, match="already started"):
                worker.start()
            with pytest.raises(RuntimeError, match="already started"):
                worker.run()
        finally:
            worker.stop()


# --- one clock ---------------------------------------------------------------------------


def test_leases_are_judged_on_the_database_clock(pg_clean_dsn: str) -> None:
    import psycopg

    with App(pg_clean_dsn) as app:
        app.migrate()
        job = app.enqueue("t")
        (claimed,) = app.store.job_claim(["default"], 1, "w", timedelta(seconds=30))
        with psycopg.connect(pg_clean_dsn) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        server_now: datetime = row[0]
        assert claimed.lease_expires_at is not None
        assert abs((claimed.lease_expires_at - server_now).total_seconds() - 30) < 2
        # A caller whose clock runs an hour fast cannot rescue it: rescue asks the server.
        assert app.store.job_rescue_expired() == []
        assert app.get(job.id).state == JobState.RUNNING
        # Tests can still fix the clock.
        assert app.store.job_rescue_expired(utcnow() + timedelta(hours=1)) == [job.id]


def test_a_worker_on_an_unmigrated_database_says_run_migrate(pg_clean_dsn: str) -> None:
    from conveyor.errors import SchemaMissingError

    with App(pg_clean_dsn) as app:  # PostgreSQL is never migrated implicitly

        @app.task
        def noop() -> None:
            return None

        worker = app.worker(maintenance=False)
        with pytest.raises(SchemaMissingError, match="conveyor migrate"):
            worker.start()
