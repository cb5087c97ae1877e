"""Middleware around every enqueue and every attempt, on every store.

Checked: every enqueue entry point is wrapped, hooks run in order (after-hooks
in reverse), headers a middleware adds reach the worker, each outcome is seen
(succeeded, failed, retried, snoozed, cancelled, released), the hooks of an
attempt run in the handler's thread or asyncio task with context variables
shared with the handler and not leaked to the next attempt, in the worker, in
``consume``/``aconsume`` and inline; a middleware that raises loses nothing;
the global chain comes before the App's own.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import (
    App,
    ConfigurationError,
    Context,
    Fail,
    FixedBackoff,
    JobState,
    Middleware,
    Retry,
)
from conveyor import middleware as conveyor_middleware
from conveyor.job import Job, NewJob, utcnow
from conveyor.middleware import Attempt, Enqueue
from conveyor.store.postgres import listener as pg_listener
from waiting import wait_until

#: Set by the middleware before an attempt; read by handlers and by the after-hook.
CURRENT = contextvars.ContextVar[str]("CURRENT")
#: Set by a caller before it enqueues; read by before_enqueue.
REQUEST = contextvars.ContextVar[str]("REQUEST")


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


class Recorder(Middleware):
    """Writes down each call, adds a header at enqueue, sets CURRENT before an attempt."""

    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.calls = calls

    def before_enqueue(self, enqueue: Enqueue) -> None:
        enqueue.headers[f"by-{self.name}"] = REQUEST.get("none")
        enqueue.state[self.name] = "mine"
        self.calls.append((self.name, "before_enqueue", enqueue.task, len(enqueue.jobs)))

    def after_enqueue(
        self, enqueue: Enqueue, jobs: list[Job] | None, error: BaseException | None
    ) -> None:
        assert enqueue.state[self.name] == "mine"
        ids = None if jobs is None else [job.id for job in jobs]
        self.calls.append(
            (self.name, "after_enqueue", ids, type(error).__name__ if error else None)
        )

    def before_attempt(self, attempt: Attempt) -> None:
        attempt.state[self.name] = (threading.get_ident(), _task_id())
        self.calls.append(
            (self.name, "before_attempt", attempt.job.id, CURRENT.get("unset"), _task_id())
        )
        CURRENT.set(f"{self.name}:{attempt.job.id}")

    def after_attempt(self, attempt: Attempt) -> None:
        same_place = attempt.state[self.name] == (threading.get_ident(), _task_id())
        self.calls.append(
            (
                self.name,
                "after_attempt",
                attempt.job.id,
                attempt.outcome,
                attempt.result,
                type(attempt.exception).__name__ if attempt.exception else None,
                CURRENT.get("unset"),
                same_place,
            )
        )


def _task_id() -> int | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return None
    return None if task is None else id(task)


def of(calls: list[tuple[Any, ...]], hook: str) -> list[tuple[Any, ...]]:
    return [call for call in calls if call[1] == hook]


@pytest.fixture
def calls() -> list[tuple[Any, ...]]:
    return []


@pytest.fixture
def mw_app(dsn: str, calls: list[tuple[Any, ...]]) -> Iterator[App]:
    with App(dsn, middleware=[Recorder("A", calls), Recorder("B", calls)]) as app:
        app.migrate()
        yield app


# --- enqueue ---------------------------------------------------------------------------------


def test_every_enqueue_entry_point_is_wrapped_in_order(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    @mw_app.task(queue="q")
    def t(x: int = 0) -> int:
        return x

    jobs = [t.enqueue(1), t.options(priority=1).enqueue(2), *t.enqueue_many([((3,), {})])]
    jobs.append(mw_app.enqueue("t", [4]))

    def in_a_request() -> list[Job]:
        # The async twins run in a thread, with the caller's context.
        REQUEST.set("request-7")
        return [
            asyncio.run(t.aenqueue(5)),
            asyncio.run(mw_app.aenqueue("t", [6])),
            asyncio.run(t.options(delay=0).aenqueue(7)),
        ]

    jobs += contextvars.copy_context().run(in_a_request)
    new = NewJob(queue="q", task="t", args_json="[8]", kwargs_json="{}", run_at=utcnow())
    jobs += mw_app.enqueue_many([new])
    assert len(calls) == 4 * 8
    for index, job in enumerate(jobs):
        four = calls[index * 4 : index * 4 + 4]
        assert [(c[0], c[1]) for c in four] == [
            ("A", "before_enqueue"),
            ("B", "before_enqueue"),
            ("B", "after_enqueue"),
            ("A", "after_enqueue"),
        ]
        assert four[0][2:] == ("t", 1) and four[2][2:] == ([job.id], None)
        request = "request-7" if 4 <= index < 7 else "none"
        assert mw_app.get(job.id).headers == {"by-A": request, "by-B": request}
        assert job.headers == {"by-A": request, "by-B": request}


def test_a_middleware_header_wins_over_the_callers(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    job = mw_app.enqueue("t", queue="q", headers={"by-A": "caller", "mine": "kept"})
    assert job.headers == {"by-A": "none", "by-B": "none", "mine": "kept"}


def test_after_enqueue_hears_of_an_insert_that_failed(
    sqlite_path: Path, calls: list[tuple[Any, ...]]
) -> None:
    # A caller's connection that was closed: the insert raises; nothing is written.
    with App(f"sqlite:///{sqlite_path}", middleware=[Recorder("A", calls)]) as app:
        app.migrate()
        closed = sqlite3.connect(sqlite_path)
        closed.close()
        with pytest.raises(sqlite3.ProgrammingError):
            app.enqueue("t", connection=closed)
        assert calls[-1] == ("A", "after_enqueue", None, "ProgrammingError")
        assert app.count_jobs(task="t") == {}


# --- attempts in the worker -------------------------------------------------------------------


def run_burst(app: App, concurrency: int = 1) -> None:
    worker = app.worker(queues=["q"], burst=True, concurrency=concurrency, maintenance=False)
    with worker:
        assert worker.wait_stopped(30)


def test_attempt_hooks_see_each_outcome_in_the_handlers_thread(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    seen: dict[str, str] = {}

    @mw_app.task(queue="q")
    def ok(x: int) -> int:
        seen["ok"] = CURRENT.get("unset")
        return x * 2

    @mw_app.task(queue="q", max_attempts=1)
    def boom() -> None:
        raise ValueError("boom")

    @mw_app.task(queue="q", max_attempts=2, backoff=FixedBackoff(3600))
    def flaky() -> None:
        raise KeyError("once")

    @mw_app.task(queue="q")
    def later() -> None:
        raise Retry(delay=3600)

    @mw_app.task(queue="q")
    def refuse() -> None:
        raise Fail("not for us")

    jobs = {
        name: task.enqueue(*args)
        for name, task, args in [
            ("ok", ok, (21,)),
            ("boom", boom, ()),
            ("flaky", flaky, ()),
            ("later", later, ()),
            ("refuse", refuse, ()),
        ]
    }
    calls.clear()
    run_burst(mw_app)
    # One handler thread: each attempt starts from a clean context, whatever the one before
    # set; B's hook sees what A's set.
    for c in of(calls, "before_attempt"):
        assert c[3] == ("unset" if c[0] == "A" else f"A:{c[2]}")
    assert seen["ok"] == f"B:{jobs['ok'].id}"  # the handler sees what the last before-hook set
    after = {(c[0], c[2]): c[3:] for c in of(calls, "after_attempt")}
    expected = {
        "ok": ("succeeded", 42, None),
        "boom": ("failed", None, "ValueError"),
        "flaky": ("retried", None, "KeyError"),
        "later": ("snoozed", None, "Retry"),
        "refuse": ("failed", None, "Fail"),
    }
    for name, (outcome, result, exception) in expected.items():
        job_id = jobs[name].id
        for mw in ("A", "B"):
            assert after[(mw, job_id)] == (outcome, result, exception, f"B:{job_id}", True)
    # Before-hooks in order, after-hooks in reverse, around each attempt.
    per_job = [(c[0], c[1]) for c in calls if c[2] == jobs["ok"].id]
    assert per_job == [
        ("A", "before_attempt"),
        ("B", "before_attempt"),
        ("B", "after_attempt"),
        ("A", "after_attempt"),
    ]
    assert mw_app.get(jobs["ok"].id).result == 42


def test_async_handlers_share_their_task_with_the_hooks(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    seen: dict[int, tuple[str, int | None]] = {}

    @mw_app.task(queue="q")
    async def hello(ctx: Context) -> str:
        seen[ctx.job.id] = (CURRENT.get("unset"), _task_id())
        return "hi"

    first, second = hello.enqueue(), hello.enqueue()
    calls.clear()
    run_burst(mw_app, concurrency=1)
    for c in of(calls, "before_attempt"):
        # Each attempt's task has a context of its own, and the handler runs in that task.
        assert c[3] == ("unset" if c[0] == "A" else f"A:{c[2]}")
        assert c[4] is not None and seen[c[2]] == (f"B:{c[2]}", c[4])
    assert set(seen) == {first.id, second.id}
    for c in of(calls, "after_attempt"):
        assert c[3:] == ("succeeded", "hi", None, f"B:{c[2]}", True)


def test_attempt_hooks_see_a_cancel_and_a_release(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    started: list[int] = []

    @mw_app.task(queue="q")
    def waits(ctx: Context) -> None:
        started.append(ctx.job.id)
        ctx.cancelled.wait(10)

    cancelled = waits.enqueue()
    worker = mw_app.worker(queues=["q"], concurrency=1, stop_timeout=0.1, maintenance=False)
    with worker:
        wait_until(lambda: started, what="the first job started")
        mw_app.cancel(cancelled.id)
        wait_until(lambda: mw_app.get(cancelled.id).state == JobState.CANCELLED)
        released = waits.enqueue()
        wait_until(lambda: len(started) == 2, what="the second job started")
    assert mw_app.get(released.id).state == JobState.QUEUED
    outcomes = {c[2]: c[3] for c in of(calls, "after_attempt") if c[0] == "A"}
    assert outcomes == {cancelled.id: "cancelled", released.id: "released"}


def test_a_failing_middleware_loses_nothing_and_is_logged(
    dsn: str, calls: list[tuple[Any, ...]], caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenBefore(Middleware):
        def before_enqueue(self, enqueue: Enqueue) -> None:
            raise RuntimeError("before enqueue")

        def after_enqueue(self, *args: Any) -> None:
            calls.append(("broken", "after_enqueue"))  # never: its before-hook raised

        def before_attempt(self, attempt: Attempt) -> None:
            raise RuntimeError("before attempt")

        def after_attempt(self, attempt: Attempt) -> None:
            calls.append(("broken", "after_attempt"))  # never: its before-hook raised

    class BrokenAfter(Middleware):
        def before_enqueue(self, enqueue: Enqueue) -> None:
            enqueue.headers["bad"] = 5  # type: ignore[assignment]  # left out, logged
            enqueue.headers["good"] = "yes"

        def after_enqueue(self, *args: Any) -> None:
            raise RuntimeError("after enqueue")

        def after_attempt(self, attempt: Attempt) -> None:
            raise RuntimeError("after attempt")

    class Exits(Middleware):
        def before_attempt(self, attempt: Attempt) -> None:
            raise SystemExit(3)  # not even this stops the attempt

    chain = [BrokenBefore(), BrokenAfter(), Exits(), Recorder("A", calls)]
    caplog.set_level(logging.ERROR, logger="conveyor.middleware")
    with App(dsn, middleware=chain) as app:
        app.migrate()

        @app.task(queue="q")
        def ok() -> str:
            return "done"

        job = ok.enqueue()
        assert job.headers == {"good": "yes", "by-A": "none"}
        run_burst(app)
        assert app.get(job.id).state == JobState.SUCCEEDED and app.get(job.id).result == "done"
    assert [c[:2] for c in calls] == [
        ("A", "before_enqueue"),
        ("A", "after_enqueue"),
        ("A", "before_attempt"),
        ("A", "after_attempt"),
    ]
    records = [r for r in caplog.records if r.name == "conveyor.middleware"]
    messages = [r.getMessage() for r in records]
    assert messages == [
        "middleware BrokenBefore: before_enqueue raised; the enqueue goes on without it",
        "middleware headers left out of a job of task ok: header 'bad' must be a string, got "
        "int (encode numbers and ids as text)",
        "middleware BrokenAfter: after_enqueue raised; the enqueue goes on without it",
        "middleware BrokenBefore: before_attempt raised; the attempt goes on without it",
        "middleware Exits: before_attempt raised; the attempt goes on without it",
        "middleware BrokenAfter: after_attempt raised; the attempt goes on without it",
    ]
    attempt_records = [r for r in records if "attempt" in r.getMessage()]
    for record in attempt_records:
        assert record.exc_info is not None  # with its traceback
        assert (record.job_id, record.task, record.queue, record.attempt) == (  # type: ignore[attr-defined]
            job.id,
            "ok",
            "q",
            1,
        )


# --- consume and inline -----------------------------------------------------------------------


def test_consume_wraps_each_job_from_hand_out_to_end(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    @mw_app.task(queue="q", backoff=FixedBackoff(3600))
    def t(n: int) -> None:
        return None

    ids = [t.enqueue(n).id for n in range(4)]
    calls.clear()
    seen = []
    for ended, job in enumerate(mw_app.consume(["q"], idle_timeout=5), 1):
        seen.append(CURRENT.get("unset"))  # set by the before-hook, in this thread
        number = job.args[0]
        if number == 0:
            job.complete(3)
        elif number == 1:
            job.fail(ValueError("no"))
        elif number == 2:
            with pytest.raises(KeyError), job:
                raise KeyError("in the block")
        else:
            job.release()
        if ended == 4:
            break
    assert seen == [f"B:{i}" for i in ids]
    after = {c[2]: c[3:6] for c in of(calls, "after_attempt") if c[0] == "A"}
    assert after == {
        ids[0]: ("succeeded", 3, None),
        ids[1]: ("retried", None, "ValueError"),
        ids[2]: ("retried", None, "KeyError"),
        ids[3]: ("released", None, None),
    }


def test_aconsume_runs_the_hooks_in_the_callers_task(
    mw_app: App, calls: list[tuple[Any, ...]]
) -> None:
    job_id = mw_app.enqueue("t", queue="q").id

    async def loop() -> str:
        async for job in mw_app.aconsume(["q"], idle_timeout=5):
            value = CURRENT.get("unset")
            job.complete("ok")
            return value
        return "none"

    assert asyncio.run(loop()) == f"B:{job_id}"
    (after,) = [c for c in of(calls, "after_attempt") if c[0] == "A"]
    assert after[2:] == (job_id, "succeeded", "ok", None, f"B:{job_id}", True)


def test_inline_mode_runs_the_attempt_after_the_enqueue(
    dsn: str, calls: list[tuple[Any, ...]]
) -> None:
    with App(dsn, middleware=[Recorder("A", calls)], inline=True) as app:
        app.migrate()

        @app.task(queue="q")
        def double(x: int) -> int:
            return x * 2

        job = double.enqueue(4)
        assert job.result == 8
    assert [c[1] for c in calls] == [
        "before_enqueue",
        "after_enqueue",
        "before_attempt",
        "after_attempt",
    ]
    assert calls[-1][3:5] == ("succeeded", 8)


# --- the global chain, and configuration ------------------------------------------------------


def test_installed_middleware_wraps_every_app_before_its_own(
    tmp_path: Path, calls: list[tuple[Any, ...]]
) -> None:
    instrumentor = Recorder("global", calls)
    conveyor_middleware.install(instrumentor)
    conveyor_middleware.install(instrumentor)  # once only
    try:
        with (
            App(f"sqlite:///{tmp_path / 'a.db'}", middleware=[Recorder("own", calls)]) as first,
            App(f"sqlite:///{tmp_path / 'b.db'}") as second,
        ):
            for app in (first, second):
                app.migrate()
                app.enqueue("t")
            assert [c[0] for c in of(calls, "before_enqueue")] == ["global", "own", "global"]
            conveyor_middleware.uninstall(instrumentor)
            conveyor_middleware.uninstall(instrumentor)  # not installed: nothing happens
            calls.clear()
            first.enqueue("t")
            assert [c[0] for c in of(calls, "before_enqueue")] == ["own"]
    finally:
        conveyor_middleware.uninstall(instrumentor)
    assert conveyor_middleware.installed() == ()


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (Middleware(), "middleware must be a list: middleware=[MyMiddleware()]"),
        ([Recorder], "middleware: pass an instance, Recorder(), not the class"),
        ([object()], "middleware must be instances of conveyor.Middleware (subclass it), got"),
    ],
)
def test_bad_middleware_is_refused_with_what_to_do(tmp_path: Path, given: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        App(f"sqlite:///{tmp_path / 'x.db'}", middleware=given)
    assert str(raised.value).startswith(says)
