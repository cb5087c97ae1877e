"""Helpers for testing code that uses conveyor, in the spirit of Oban.Testing and rivertest.

Run jobs without a worker, in the test's own thread, through the real store
(claim under a lease, then complete or fail with the lease token), so a test
sees exactly the rows, states and events a worker would leave::

    from conveyor.testing import assert_enqueued, drain, inline

    def test_signup_sends_a_welcome_mail(app):
        signup("ada@example.com")                 # enqueues send_mail
        assert_enqueued(app, send_mail, kwargs={"to": "ada@example.com"})
        assert drain(app, queues=["mail"]) == {"succeeded": 1}

    def test_report(app):
        with inline(app):
            job = build_report.enqueue(2024)      # runs before enqueue returns
        assert job.state == "succeeded" and job.result == {...}

What differs from a worker: handlers run one at a time in the calling thread,
a task's ``timeout`` is not enforced, leases are not renewed (nothing else
claims meanwhile), and a cancel requested while a handler runs does not stop it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from conveyor.job import Job, JobState, NewJob, utcnow
from conveyor.store.base import Completion, Failure, JobFilter, Lease, Snooze
from conveyor.task import EnqueueOptions, Task
from conveyor.worker.context import Context
from conveyor.worker.execution import (
    Outcome,
    Running,
    call_args,
    outcome_of_exception,
    outcome_of_result,
    poison_outcome,
)

if TYPE_CHECKING:
    from conveyor.app import App

__all__ = [
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "inline",
    "refute_enqueued",
    "run_job",
]

#: Lease of a job run here. Long, since nothing renews it while the handler runs.
LEASE = timedelta(minutes=10)
#: How far ahead ``with_scheduled`` looks: every deferred or retrying job is due by then.
FAR_FUTURE = timedelta(days=365 * 100)
#: Jobs one drain runs at most: a handler that always asks to run again cannot loop forever.
DEFAULT_LIMIT = 10_000

TaskRef = Task[Any, Any] | str


def _task_name(task: TaskRef) -> str:
    return task if isinstance(task, str) else task.name


# --- running jobs ------------------------------------------------------------------


def drain(
    app: App,
    queues: Sequence[str] | None = None,
    *,
    with_scheduled: bool = False,
    limit: int = DEFAULT_LIMIT,
) -> dict[str, int]:
    """Run ready jobs in this thread until none is left; count what happened to them.

    ``queues`` defaults to every queue of the app's tasks. Returns counts of the
    outcomes, only those that occurred: ``succeeded``, ``retried`` (failed with
    attempts left), ``failed``, ``snoozed`` (the handler raised ``Retry``),
    ``cancelled``. Jobs queued while draining (by the handlers themselves) run
    too. With ``with_scheduled``, deferred jobs and retries waiting for their
    backoff run at once as well, so a failing job runs until its attempts are
    spent. Stops after ``limit`` jobs.
    """
    chosen = list(queues) if queues else sorted({t.queue for t in app.tasks.values()})
    counts: dict[str, int] = {}
    if not chosen:
        return counts
    worker = f"testing:{uuid.uuid4().hex[:8]}"
    for _ in range(limit):
        now = utcnow()
        # A claim "as of" a far future moment makes every deferred job due.
        claim_now = now + FAR_FUTURE if with_scheduled else now
        claimed = app.store.job_claim(chosen, 1, worker, LEASE, claim_now)
        if not claimed:
            break
        outcome = run_job(app, claimed[0])
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def run_job(app: App, job: Job) -> str:
    """Run one job this caller claimed (``job.lease_token`` set) and record its outcome.

    Returns what became of it: succeeded, retried, failed, snoozed or cancelled
    (or ``lost`` when its lease no longer held).
    """
    running = Running(job=job, task=app.tasks.get(job.task), context=Context(job))
    lease = Lease(job.id, running.token)
    running.context._progress = lambda fraction, message: app.store.job_progress(
        lease, fraction, message, utcnow()
    )
    running.context._heartbeat = lambda: bool(app.store.job_heartbeat([lease], LEASE, utcnow()))
    outcome = poison_outcome(running) or _call(running)
    return _record(app, running, outcome)


def _call(running: Running) -> Outcome:
    assert running.task is not None
    try:
        args, kwargs = call_args(running)
        result = running.task.fn(*args, **kwargs)
        if running.task.is_async:
            result = _run_coroutine(result)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt, SystemExit: the test run is ending
        return outcome_of_exception(exc, running, utcnow())
    return outcome_of_result(result)


def _run_coroutine(coroutine: Any) -> Any:
    """Await an async handler here, or on a thread of its own inside an async test."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = asyncio.run(coroutine)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, name="conveyor-testing-async")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _record(app: App, running: Running, outcome: Outcome) -> str:
    store, job, now = app.store, running.job, utcnow()
    if outcome.kind == "complete":
        done = store.job_complete([Completion(job.id, running.token, outcome.result_json)], now)
    elif outcome.kind == "fail":
        failure = Failure(
            job.id,
            running.token,
            outcome.error or "failed",
            outcome.run_at or now,
            outcome.retryable,
        )
        done = store.job_fail([failure], now)
    elif outcome.kind == "snooze":
        done = store.job_snooze([Snooze(job.id, running.token, outcome.run_at or now)], now)
    else:
        done = store.job_release([Lease(job.id, running.token)], now)
    app.changes.publish("done", str(job.id))
    if not done:
        return "lost"
    state = app.get(job.id).state
    if outcome.kind == "fail" and state == JobState.QUEUED:
        return "retried"
    if outcome.kind == "snooze" and state == JobState.QUEUED:
        return "snoozed"
    return str(state)


@contextmanager
def inline(app: App, *, with_scheduled: bool = True) -> Iterator[App]:
    """Run every job enqueued on ``app`` inside the block before the enqueue returns.

    ``task.enqueue(...)`` then returns the job as it ended: ``job.state``,
    ``job.result`` and ``job.error`` are filled in (``job.wait()`` returns the
    result or raises JobFailed). The job goes through the store like any other,
    so it is also claimed, finished and recorded in the history. To get there,
    the new jobs' queues are drained: ready jobs already waiting there run too.
    By default retries and deferred jobs run at once (``with_scheduled``), so a
    failing job has spent all its attempts when the enqueue returns.
    """
    original_calls = app.enqueue_calls
    original_many = app.enqueue_many

    def settle(jobs: list[Job]) -> list[Job]:
        for queue in dict.fromkeys(job.queue for job in jobs):
            drain(app, [queue], with_scheduled=with_scheduled)
        return [app.get(job.id) for job in jobs]

    def enqueue_calls(
        task: str, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], opts: EnqueueOptions
    ) -> list[Job]:
        return settle(original_calls(task, calls, opts))

    def enqueue_many(jobs: Iterable[NewJob]) -> list[Job]:
        return settle(original_many(jobs))

    # Instance attributes shadow the methods for this App only, and only until the block ends.
    app.enqueue_calls = enqueue_calls  # type: ignore[method-assign]
    app.enqueue_many = enqueue_many  # type: ignore[method-assign]
    try:
        yield app
    finally:
        del app.enqueue_calls
        del app.enqueue_many


# --- asserting what was enqueued ------------------------------------------------------------


def enqueued_jobs(
    app: App,
    task: TaskRef | None = None,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    state: JobState | str | None = JobState.QUEUED,
) -> list[Job]:
    """Jobs waiting to run (``state=None``: in any state) that match, oldest first.

    ``args`` must equal the job's arguments; ``kwargs`` must be contained in the
    job's keyword arguments (the job may have more).
    """
    job_filter = JobFilter(
        state=JobState(state) if state is not None else None,
        queue=queue,
        task=_task_name(task) if task is not None else None,
        limit=1000,
    )
    found: list[Job] = []
    page = app.store.job_list(job_filter)
    while page:
        found.extend(page)
        if len(page) < job_filter.limit:
            break
        page = app.store.job_list(_next_page(job_filter, page[-1].id))
    return [job for job in reversed(found) if _matches(job, args, kwargs)]


def _next_page(job_filter: JobFilter, before_id: int) -> JobFilter:
    return JobFilter(
        state=job_filter.state,
        queue=job_filter.queue,
        task=job_filter.task,
        before_id=before_id,
        limit=job_filter.limit,
    )


def _matches(job: Job, args: Sequence[Any] | None, kwargs: dict[str, Any] | None) -> bool:
    try:
        if args is not None and job.args != list(args):
            return False
        if kwargs is not None:
            have = job.kwargs
            return all(name in have and have[name] == value for name, value in kwargs.items())
    except ValueError:
        return False  # an undecodable payload matches nothing
    return True


def assert_enqueued(
    app: App,
    task: TaskRef,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
) -> Job:
    """Assert that a job of ``task`` matching the arguments waits to run; return the oldest.

    The failure message lists what is enqueued for the task instead.
    """
    matching = enqueued_jobs(app, task, args=args, kwargs=kwargs, queue=queue)
    if matching:
        return matching[0]
    others = enqueued_jobs(app, task)
    wanted = _describe(_task_name(task), args, kwargs, queue)
    if not others:
        raise AssertionError(f"expected {wanted} to be enqueued; no job of the task is")
    listed = "\n".join(f"  {_job_line(job)}" for job in others[:20])
    more = f"\n  ... and {len(others) - 20} more" if len(others) > 20 else ""
    raise AssertionError(f"expected {wanted} to be enqueued; the task has:\n{listed}{more}")


def refute_enqueued(
    app: App,
    task: TaskRef,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
) -> None:
    """Assert that no job of ``task`` matching the arguments waits to run."""
    matching = enqueued_jobs(app, task, args=args, kwargs=kwargs, queue=queue)
    if matching:
        wanted = _describe(_task_name(task), args, kwargs, queue)
        listed = "\n".join(f"  {_job_line(job)}" for job in matching[:20])
        raise AssertionError(f"expected no {wanted} to be enqueued; found:\n{listed}")


def _describe(
    name: str,
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    queue: str | None,
) -> str:
    parts = [f"job of {name!r}"]
    if args is not None:
        parts.append(f"args={list(args)!r}")
    if kwargs is not None:
        parts.append(f"kwargs including {kwargs!r}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    return " ".join(parts)


def _job_line(job: Job) -> str:
    return f"job {job.id} queue={job.queue!r} args={job.args_json} kwargs={job.kwargs_json}"
