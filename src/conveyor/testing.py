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

Handlers run on the worker's own execution path (the same executor and
completer), one at a time in the calling thread. What differs from a worker:
a task's ``timeout`` is not enforced, leases are not renewed (a long one is
taken instead), and a cancel requested while a handler runs does not stop it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from conveyor.job import Job, JobState, utcnow
from conveyor.store.capabilities import operator_store
from conveyor.store.records import JobSelection, Page
from conveyor.task import Task
from conveyor.worker.inline import DEFAULT_LIMIT, run_job
from conveyor.worker.inline import drain as _drain

#: Jobs read per page by enqueued_jobs.
PAGE = 1000

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
    spent. Stops after ``limit`` jobs. Handlers run on the worker's execution
    path (claim, executor, completer), in this thread.
    """
    return _drain(app.runtime, queues, with_scheduled=with_scheduled, limit=limit)


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

    This switches on the App's own inline mode (``App(dsn, inline=True)``) for
    the block.
    """
    previous = app.inline
    app.set_inline(True, with_scheduled=with_scheduled)
    try:
        yield app
    finally:
        app.set_inline(previous)


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
    selection = JobSelection(
        state=None if state is None else str(JobState(state)),
        queue=queue,
        task=_task_name(task) if task is not None else None,
    )
    found: list[Job] = []
    page = operator_store(app.store, "read enqueued jobs").job_select(
        selection, utcnow(), Page(PAGE)
    )
    while page:
        found.extend(page)
        if len(page) < PAGE:
            break
        page = operator_store(app.store, "read enqueued jobs").job_select(
            selection, utcnow(), Page(PAGE, page[-1].id)
        )
    # Attached to the App, so that job.wait() and job.refresh() work as on enqueue's Jobs.
    return [app._attach(job) for job in reversed(found) if _matches(job, args, kwargs)]


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
