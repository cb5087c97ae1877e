"""What the pages show and do, apart from HTTP: actions on jobs, workers with their jobs,
periodic tasks with their ticks."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from conveyor import signals
from conveyor.app import App
from conveyor.errors import JobStateError
from conveyor.fleet import MAX_HELD_READ, WorkerStatus
from conveyor.job import WAITING_STATES, Job, JobState
from conveyor.schedule import Cron, Every
from conveyor.web.params import BadRequest


@dataclass(frozen=True)
class BulkAction:
    """An action on many jobs: its form value, its button, the App method and where it applies."""

    code: str
    label: str
    method: str
    applies_to: tuple[str, ...]
    #: What the action did to a job, for the confirmation page.
    past: str
    danger: bool = False


BULK_ACTIONS = {
    action.code: action
    for action in (
        BulkAction("retry", "Retry", "retry_jobs", ("failed", "cancelled"), "queued again"),
        BulkAction("run_now", "Run now", "run_jobs_now", ("scheduled", "retrying"), "made due now"),
        BulkAction(
            "cancel",
            "Cancel",
            "cancel_jobs",
            ("waiting", *WAITING_STATES, "running"),
            "cancelled (running ones: asked to stop)",
            danger=True,
        ),
        BulkAction(
            "delete",
            "Delete",
            "delete_jobs",
            ("waiting", *WAITING_STATES, "succeeded", "failed", "cancelled"),
            "deleted with their history",
            danger=True,
        ),
        BulkAction(
            "take_back",
            "Take back",
            "take_back",
            ("running",),
            "taken from their worker and queued again",
            danger=True,
        ),
    )
}
#: The buttons of a job's page, by the path segment of their POST.
JOB_ACTIONS = ("retry", "cancel", "run-now", "delete", "take-back", "hold", "unhold", "wake")


def act_on_job(app: App, name: str, job_id: int) -> str:
    """Run a job page's action; answer the notice code (and where to go after a delete)."""
    if name == "retry":
        app.retry(job_id)
        return "retried"
    if name == "cancel":
        job = app.cancel(job_id)
        return "cancel_requested" if job.state == JobState.RUNNING else "cancelled"
    if name == "hold":
        app.hold(job_id)  # JobStateError says why a job that is not queued cannot be held
        return "held"
    if name == "unhold":
        app.unhold(job_id)
        return "unheld"
    if name == "wake":  # a parked job (ctx.sleep, ctx.wait_for, ctx.wait): due now
        signals.wake(app.durable, job_id, app.get)
        return "run_now"
    job = app.get(job_id)
    state = job.detailed_state()
    if name == "run-now":
        _expect(job, state, ("scheduled", "retrying"), "run now")
        app.run_jobs_now([job_id])
        return "run_now"
    if name == "take-back":
        _expect(job, state, ("running",), "be taken back")
        app.take_back([job_id])
        return "taken_back" if app.get(job_id).state == JobState.QUEUED else "taken_back_failed"
    _expect(job, state, BULK_ACTIONS["delete"].applies_to, "be deleted (cancel it first)")
    if not app.delete_jobs([job_id]):
        raise JobStateError(f"job {job_id} started meanwhile: cancel it first")
    return "deleted@/jobs"


def _expect(job: Job, state: str, allowed: Sequence[str], verb: str) -> None:
    if state not in allowed:
        raise JobStateError(f"job {job.id} is {state}: only {' or '.join(allowed)} jobs can {verb}")


def orphans(app: App, workers: Sequence[WorkerStatus]) -> list[Job]:
    """Running jobs whose worker is not listed (it died and was forgotten): their leases
    bring them back."""
    held = {job.id for w in workers for job in w.jobs}
    running = app.jobs(state="running", limit=MAX_HELD_READ)
    return sorted((job for job in running if job.id not in held), key=lambda j: j.id)


@dataclass(frozen=True)
class PeriodicRow:
    task: str
    #: "every 5 min" or the cron expression; None when this process does not know the task.
    schedule: str | None
    last_tick: datetime | None
    next_tick: datetime | None


def periodic_rows(app: App, now: datetime) -> list[PeriodicRow]:
    """The App's periodic tasks with their last tick (from the store) and next one.

    Tasks the store has ticks of but this App does not register (a dashboard
    started without ``--app``) are listed with their last tick only.
    """
    last = app.periodic_ticks()
    rows = []
    known = set()
    for periodic in app.periodic_tasks:
        known.add(periodic.task)
        rows.append(
            PeriodicRow(
                periodic.task,
                describe_schedule(periodic.schedule),
                last.get(periodic.task),
                periodic.schedule.next_tick(now),
            )
        )
    for task, tick in sorted(last.items()):
        if task not in known:
            rows.append(PeriodicRow(task, None, tick, None))
    return rows


def describe_schedule(schedule: object) -> str:
    if isinstance(schedule, Every):
        return f"every {_interval(schedule.interval)}"
    if isinstance(schedule, Cron):
        return f"cron {schedule.expression} (UTC)"
    return str(schedule)


def _interval(interval: timedelta) -> str:
    total = int(interval.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if total % size == 0 and total >= size:
            return f"{total // size} {unit}"
    return f"{total} s"


def waits_of(app: App, job: Job) -> dict[str, Any]:
    """The job page's signals and waits: what a parked job waits for, the signals it was
    sent, and whether the store keeps them (``durable``: the form to send one)."""
    port = app.durable
    if port is None:
        return {"durable": False, "waits": None, "signals": []}
    waits = port.job_waiting(job.id) if job.state == JobState.QUEUED else None
    return {"durable": True, "waits": waits, "signals": port.signal_list(job.id)}


def signal_form(name: str, payload: str) -> tuple[str, Any]:
    """The signal's name and payload as the job page's form gives them (payload: JSON text,
    empty for null)."""
    if not name.strip():
        raise BadRequest("give the signal's name")
    if not payload.strip():
        return name, None
    try:
        return name, json.loads(payload)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the payload is not JSON: {exc.msg} at character {exc.pos}") from None
