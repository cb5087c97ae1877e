"""Running one claimed job's handler and turning what happened into an outcome.

No store access here: the worker's control loop writes outcomes in batches.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from conveyor.errors import Fail, InvalidJobError, Retry, UnknownTaskError
from conveyor.job import Job, encode_json, utcnow
from conveyor.task import Task
from conveyor.worker.context import Context

OutcomeKind = Literal["complete", "fail", "snooze", "release", "cancelled"]


@dataclass
class Outcome:
    kind: OutcomeKind
    result_json: str | None = None
    error: str | None = None
    retryable: bool = True
    #: For fail: when to retry; for snooze: when to run again.
    run_at: datetime | None = None


@dataclass
class Running:
    """A job this worker holds under a lease."""

    job: Job
    task: Task[Any, Any] | None
    context: Context
    started: float = field(default_factory=time.monotonic)
    #: monotonic deadline from the task's timeout, if any.
    deadline: float | None = None
    #: The handler's own result, once it returned or raised.
    outcome: Outcome | None = None
    #: The outcome was already recorded (e.g. a timeout), so the handler's is ignored.
    settled: bool = False
    #: The store said our lease no longer holds: nothing we write will count.
    lost: bool = False
    #: Why the worker aborted it: "cancel", "timeout" or "shutdown".
    abort: str | None = None
    #: For async handlers: the asyncio task, to cancel it.
    async_task: asyncio.Task[Any] | None = None
    async_loop: asyncio.AbstractEventLoop | None = None
    future: Future[None] | None = None
    #: The payload, decoded once when the job was checked.
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def token(self) -> str:
        assert self.job.lease_token is not None
        return self.job.lease_token


def poison_outcome(running: Running) -> Outcome | None:
    """An outcome for a job that can never run: unknown task or undecodable payload.

    Decodes the payload into ``running.args`` and ``running.kwargs`` on the way.
    """
    job, task = running.job, running.task
    if task is None:
        return Outcome(
            "fail",
            error=str(
                UnknownTaskError(f"no task named {job.task!r} is registered with this worker")
            ),
            retryable=False,
        )
    try:
        running.args, running.kwargs = job.args, job.kwargs
    except (ValueError, json.JSONDecodeError) as exc:
        return Outcome("fail", error=f"undecodable payload: {exc}", retryable=False)
    return None


def outcome_of_result(result: Any) -> Outcome:
    try:
        return Outcome("complete", result_json=encode_json("result", result))
    except InvalidJobError as exc:
        # Not retried: the handler would return the same kind of value again,
        # repeating its side effects for nothing (and with no backoff).
        return Outcome(
            "fail", error=f"the handler's return value cannot be stored: {exc}", retryable=False
        )


def outcome_of_exception(exc: BaseException, running: Running, now: datetime) -> Outcome:
    if isinstance(exc, Retry):
        return Outcome("snooze", run_at=now + timedelta(seconds=max(0.0, exc.delay)))
    error = "".join(traceback.format_exception(exc))
    if isinstance(exc, Fail):
        return Outcome("fail", error=error, retryable=False)
    assert running.task is not None
    delay = running.task.backoff.delay(running.job.attempts)
    return Outcome("fail", error=error, run_at=now + timedelta(seconds=delay))


def call_args(running: Running) -> tuple[list[Any], dict[str, Any]]:
    assert running.task is not None
    args = running.args
    if running.task.takes_context:
        args = [running.context, *args]
    return args, running.kwargs


def run_sync(running: Running, done: Callable[[Running], None]) -> None:
    """Run a sync handler in this (pool) thread; report through ``done``."""
    assert running.task is not None
    try:
        args, kwargs = call_args(running)
        result = running.task.fn(*args, **kwargs)
    except BaseException as exc:
        running.outcome = outcome_of_exception(exc, running, utcnow())
    else:
        running.outcome = outcome_of_result(result)
    done(running)


async def run_async(running: Running, done: Callable[[Running], None]) -> None:
    """Run an async handler on the worker's event loop; report through ``done``."""
    assert running.task is not None
    running.async_task = asyncio.current_task()
    try:
        if running.abort:  # aborted before it started
            raise asyncio.CancelledError
        args, kwargs = call_args(running)
        result = await running.task.fn(*args, **kwargs)
    except asyncio.CancelledError:
        running.outcome = Outcome("release")  # replaced by the abort reason when reported
    except BaseException as exc:
        running.outcome = outcome_of_exception(exc, running, utcnow())
    else:
        running.outcome = outcome_of_result(result)
    done(running)


class EventLoopThread:
    """An asyncio event loop the worker owns, for async handlers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="conveyor-async", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Let cancelled handlers finish their cleanup before the loop closes.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    def submit(self, running: Running, done: Callable[[Running], None]) -> Future[None]:
        running.async_loop = self.loop
        return asyncio.run_coroutine_threadsafe(run_async(running, done), self.loop)

    def cancel(self, running: Running) -> None:
        task = running.async_task
        if task is not None:
            self.loop.call_soon_threadsafe(task.cancel)

    def close(self, timeout: float = 5.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
