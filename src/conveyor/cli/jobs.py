"""Producing and inspecting jobs: ``conveyor enqueue`` and ``conveyor jobs ...``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import click

from conveyor.cli.options import Duration, JsonValue, dsn_option, json_option, open_app
from conveyor.cli.output import (
    STATES,
    console,
    event_dict,
    job_dict,
    job_view,
    jobs_table,
    print_json,
    progress,
)
from conveyor.errors import ConveyorError
from conveyor.store.dsn import DSN_ENV
from conveyor.task import EnqueueOptions, Task

#: Calls per transaction when enqueueing from a file or with --count.
ENQUEUE_BATCH = 1000


@click.command()
@click.argument("task")
@click.option("--args", "args", type=JsonValue(list), default="[]", help="JSON array.")
@click.option("--kwargs", "kwargs", type=JsonValue(dict), default="{}", help="JSON object.")
@click.option("--queue", default=None, help="Queue (default: the task's, else 'default').")
@click.option("--key", default=None, help="Idempotency key: no second live job with it.")
@click.option("--group", default=None, help="Ordering key: one job of a group at a time.")
@click.option("--delay", type=Duration(), default=None, help="Run later: 90s, 30m, 2h...")
@click.option("--priority", type=int, default=None, help="Higher runs first.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--count", type=click.IntRange(min=1), default=1, help="Enqueue this many copies.")
@click.option(
    "--file",
    "calls_file",
    type=click.File("r"),
    default=None,
    help='JSON lines, one job each: {"args": [...], "kwargs": {...}} ("-": stdin).',
)
@click.option(
    "--app",
    "app_path",
    metavar="MODULE:APP",
    default=None,
    help="Take the task's queue, priority and attempts from this App, and check the arguments.",
)
@dsn_option
@json_option
def enqueue(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    queue: str | None,
    key: str | None,
    group: str | None,
    delay: timedelta | None,
    priority: int | None,
    max_attempts: int | None,
    count: int,
    calls_file: Any,
    app_path: str | None,
    dsn: str | None,
    as_json: bool,
) -> None:
    """Enqueue jobs of TASK by name (the handler's code is not needed here).

    Without --app, the job goes to --queue, else to 'default', whatever queue the
    task is registered on: give one or the other.
    """
    registry = _registry(app_path, dsn)
    if registry is not None and task not in registry:
        raise click.BadParameter(
            f"{app_path} has no task {task!r}; it has: {', '.join(sorted(registry)) or 'none'}",
            param_hint="TASK",
        )
    opts = EnqueueOptions(
        queue=queue,
        key=key,
        group=group,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
    )
    if calls_file is not None:
        calls: Iterator[tuple[list[Any], dict[str, Any]]] = _calls_from_file(calls_file)
        total = None
    else:
        calls = iter([(args, kwargs)] * count)
        total = count
    ids: list[int] = []
    with open_app(dsn) as app, progress(f"enqueueing {task}", total) as advance:
        if registry is not None:
            # The task's defaults come from its registration; its handler never runs here.
            app.tasks.update(registry)
        batch: list[tuple[list[Any], dict[str, Any]]] = []
        for call in calls:
            if registry is not None:
                registry[task].check_arguments(*call)
            batch.append(call)
            if len(batch) == ENQUEUE_BATCH:
                ids.extend(job.id for job in app.enqueue_calls(task, batch, opts))
                advance(len(batch))
                batch = []
        if batch:
            ids.extend(job.id for job in app.enqueue_calls(task, batch, opts))
            advance(len(batch))
        if as_json:
            if len(ids) == 1:
                print_json(job_dict(app.get(ids[0])))
            else:
                print_json({"task": task, "count": len(ids), "ids": ids})
            return
    if len(ids) == 1:
        click.echo(f"enqueued job {ids[0]} ({task})")
    else:
        click.echo(f"enqueued {len(ids):,} jobs of {task} (ids {min(ids)}..{max(ids)})")


def _registry(app_path: str | None, dsn: str | None) -> dict[str, Task[Any, Any]] | None:
    """The tasks of the App at MODULE:APP (imported with --dsn in $CONVEYOR_DSN, as the worker)."""
    if app_path is None:
        return None
    if dsn:
        os.environ[DSN_ENV] = dsn
    from conveyor.cli.worker import load_app

    loaded = load_app(app_path)
    tasks = dict(loaded.tasks)
    loaded.close()  # only its registry is needed; jobs go to --dsn through our own App
    return tasks


def _calls_from_file(lines: Any) -> Iterator[tuple[list[Any], dict[str, Any]]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            call = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"line {number} is not JSON: {exc.msg}") from None
        if not isinstance(call, dict) or not set(call) <= {"args", "kwargs"}:
            expected = '{"args": [...], "kwargs": {...}}'
            raise click.BadParameter(f"line {number}: expected {expected}")
        yield call.get("args", []), call.get("kwargs", {})


@click.group()
def jobs() -> None:
    """List, show, retry and cancel jobs."""


@jobs.command("list")
@click.option("--state", type=click.Choice(STATES), default=None)
@click.option("--queue", default=None)
@click.option("--task", default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--before", "before_id", type=int, default=None, help="Next page: ids below this.")
@dsn_option
@json_option
def list_jobs(
    state: str | None,
    queue: str | None,
    task: str | None,
    limit: int,
    before_id: int | None,
    dsn: str | None,
    as_json: bool,
) -> None:
    """Jobs, newest first."""
    with open_app(dsn) as app:
        found = app.jobs(state=state, queue=queue, task=task, limit=limit, before_id=before_id)
    if as_json:
        print_json([job_dict(job) for job in found])
        return
    if not found:
        click.echo("no jobs match")
        return
    console().print(jobs_table(found))
    if len(found) == limit:
        click.echo(f"more: --before {found[-1].id}")


@jobs.command("show")
@click.argument("job_id", type=int)
@dsn_option
@json_option
def show_job(job_id: int, dsn: str | None, as_json: bool) -> None:
    """A job: payload, result, error with traceback, and its event timeline."""
    with open_app(dsn) as app:
        job = app.get(job_id)
        events = app.events(job_id)
    if as_json:
        print_json({**job_dict(job), "events": [event_dict(e) for e in events]})
        return
    console().print(job_view(job, events))


@jobs.command("retry")
@click.argument("job_id", type=int, required=False)
@click.option("--all-failed", is_flag=True, help="Every failed job (of --queue, or all).")
@click.option("--queue", default=None, help="With --all-failed: only this queue.")
@dsn_option
def retry_jobs(job_id: int | None, all_failed: bool, queue: str | None, dsn: str | None) -> None:
    """Queue a failed or cancelled job again (attempts reset), or every failed one."""
    if (job_id is None) == (not all_failed):
        raise click.UsageError("give a JOB_ID or --all-failed (not both)")
    if queue is not None and not all_failed:
        raise click.UsageError("--queue goes with --all-failed")
    with open_app(dsn) as app:
        if job_id is not None:
            job = app.retry(job_id)
            click.echo(f"job {job.id} queued again ({job.task} on {job.queue})")
            return
        total = app.stats().count("failed", queue)
        with progress("retrying failed jobs", total) as advance:
            retried = app.retry_failed(queue, on_batch=advance)
    where = f" in queue {queue}" if queue else ""
    click.echo(f"{retried:,} failed job(s){where} queued again")


@jobs.command("cancel")
@click.argument("job_id", type=int)
@dsn_option
def cancel_job(job_id: int, dsn: str | None) -> None:
    """Cancel a queued job, or ask the worker of a running one to stop."""
    with open_app(dsn) as app:
        job = app.cancel(job_id)
    if job.state == "cancelled":
        click.echo(f"job {job.id} cancelled")
    elif job.cancel_requested and job.state == "running":
        click.echo(f"job {job.id} is running: its worker was asked to stop it")
    else:
        raise ConveyorError(f"job {job.id} is already {job.state}; nothing to cancel")
