"""A middleware hook that raises what is not an ``Exception`` still lets every job end.

``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit`` or a ``BaseException``
of the application's own, raised by ``before_attempt`` or ``after_attempt``
around a sync or an async handler: each job's outcome is recorded, the
hook's failure is logged naming what it raised, and the worker (or the
consume loop, or inline mode) goes on with the next job, on every store. An
outcome that cannot be made fails the job naming why; an after-hook that
hangs at shutdown does not make a job whose handler returned run again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from conveyor import App, JobState, Middleware
from conveyor.middleware import Attempt
from conveyor.store.postgres import listener as pg_listener


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


class Halt(BaseException):
    """An application's own BaseException, as a framework might raise to stop a thread."""


#: What the hooks raise, by the name a job carries in its headers.
RAISED: dict[str, type[BaseException]] = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
    "GeneratorExit": GeneratorExit,
    "Halt": Halt,
}


class Raises(Middleware):
    """Raises, in the hook it was made for, what the job's ``raise`` header names."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def _maybe_raise(self, hook: str, attempt: Attempt) -> None:
        name = (attempt.job.headers or {}).get("raise")
        if hook == self.hook and name is not None:
            raise RAISED[name](f"from {hook}")

    def before_attempt(self, attempt: Attempt) -> None:
        self._maybe_raise("before_attempt", attempt)

    def after_attempt(self, attempt: Attempt) -> None:
        self._maybe_raise("after_attempt", attempt)


@pytest.fixture(params=["before_attempt", "after_attempt"])
def hook(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def stop_app(dsn: str, hook: str) -> Iterator[App]:
    with App(dsn, middleware=[Raises(hook)]) as application:
        application.migrate()
        yield application


def _failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The middleware's log lines, each with the name of what its hook raised."""
    return [
        f"{r.getMessage()} [{r.exc_info[0].__name__ if r.exc_info and r.exc_info[0] else '-'}]"
        for r in caplog.records
        if r.name == "conveyor.middleware"
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_hook_that_raises_a_base_exception_ends_its_job_and_the_worker_goes_on(
    stop_app: App, hook: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    if kind == "sync":

        @stop_app.task(queue="q")
        def work(n: int) -> int:
            return n * 2

    else:

        @stop_app.task(queue="q")
        async def work(n: int) -> int:
            return n * 2

    caplog.set_level(logging.ERROR, logger="conveyor.middleware")
    raising = [work.options(headers={"raise": name}).enqueue(n) for n, name in enumerate(RAISED)]
    plain = work.enqueue(10)
    # One slot: a handler thread (or the event loop) killed by the first job would
    # leave every later one queued, and the burst would never end.
    worker = stop_app.worker(queues=["q"], burst=True, concurrency=1, maintenance=False)
    with worker:
        stopped = worker.wait_stopped(30)
        if not stopped:
            worker.stop(graceful=False)
    assert stopped, "the worker never ran out of work: a job was left running"
    for n, job in enumerate([*raising, plain]):
        ended = stop_app.get(job.id)
        assert ended.state == JobState.SUCCEEDED, (job.headers, ended.state, ended.error)
        assert ended.result == (n if job is not plain else 10) * 2
    assert _failures(caplog) == [
        f"middleware Raises: {hook} raised; the attempt goes on without it [{name}]"
        for name in RAISED
    ]


def test_consume_and_inline_mode_end_the_job_whatever_a_hook_raises(
    stop_app: App, dsn: str, hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="conveyor.middleware")
    ids = [stop_app.enqueue("t", queue="q", headers={"raise": name}).id for name in RAISED]
    handed_out = []
    for job in stop_app.consume(["q"], idle_timeout=1):
        handed_out.append(job.id)
        job.complete("done")
        if len(handed_out) == len(ids):
            break
    assert handed_out == ids
    assert [stop_app.get(i).state for i in ids] == [JobState.SUCCEEDED] * len(ids)

    with App(dsn, middleware=[Raises(hook)], inline=True) as inline:

        @inline.task(queue="inline")
        def double(x: int) -> int:
            return x * 2

        jobs = [double.options(headers={"raise": name}).enqueue(3) for name in RAISED]
        assert [inline.get(j.id).result for j in jobs] == [6] * len(RAISED)
    assert len(_failures(caplog)) == 2 * len(RAISED)


class HaltingBackoff:
    """A backoff policy that, once the worker runs, raises what is not an Exception."""

    def __init__(self) -> None:
        self.armed = False  # a task's backoff is tried when it is declared

    def delay(self, attempt: int) -> float:
        if self.armed:
            raise Halt("no delay today")
        return 1.0


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_outcome_that_cannot_be_made_fails_the_job_naming_why(app: App, kind: str) -> None:
    backoff = HaltingBackoff()
    if kind == "sync":

        @app.task(queue="q", backoff=backoff)
        def flaky() -> None:
            raise ValueError("once")

    else:

        @app.task(queue="q", backoff=backoff)
        async def flaky() -> None:
            raise ValueError("once")

    @app.task(queue="q")
    def fine() -> str:
        return "ok"

    backoff.armed = True
    failing, after = flaky.enqueue(), fine.enqueue()
    worker = app.worker(queues=["q"], burst=True, concurrency=1, maintenance=False)
    with worker:
        stopped = worker.wait_stopped(30)
        if not stopped:
            worker.stop(graceful=False)
    assert stopped, "the worker never ran out of work: a job was left running"
    ended = app.get(failing.id)
    assert ended.state == JobState.FAILED
    assert ended.error is not None and "Halt: no delay today" in ended.error
    assert app.get(after.id).result == "ok"


class HangsAfter(Middleware):
    """An after-hook that hangs (a span exporter that never answers) until let go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.let_go = threading.Event()

    def after_attempt(self, attempt: Attempt) -> None:
        self.entered.set()
        self.let_go.wait(60)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_that_returned_keeps_its_outcome_when_an_after_hook_hangs_at_shutdown(
    dsn: str, kind: str
) -> None:
    hangs = HangsAfter()
    runs: list[int] = []
    with App(dsn, middleware=[hangs]) as app:
        app.migrate()
        if kind == "sync":

            @app.task(queue="q")
            def work(n: int) -> int:
                runs.append(n)
                return n * 2

        else:

            @app.task(queue="q")
            async def work(n: int) -> int:
                runs.append(n)
                return n * 2

        job = work.enqueue(21)
        worker = app.worker(queues=["q"], stop_timeout=0.2, maintenance=False)
        try:
            with worker:
                assert hangs.entered.wait(10), "the handler never returned"
            # The drain gave up waiting for the hook: the handler's outcome is recorded,
            # not a release that would run the job a second time.
            ended = app.get(job.id)
            assert (ended.state, ended.result) == (JobState.SUCCEEDED, 42)
        finally:
            hangs.let_go.set()
        assert runs == [21]
