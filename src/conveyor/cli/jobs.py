"""Producing and inspecting jobs: ``conveyor enqueue`` and ``conveyor jobs ...``."""

from __future__ import annotations

import difflib
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import click
from rich.text import Text

from conveyor.app import KNOWN_TASKS_READ, App
from conveyor.audit import record_cli
from conveyor.cli.options import (
    Bounded,
    Duration,
    JobId,
    JsonValue,
    dsn_option,
    given,
    json_option,
    open_app,
    selection_options,
    within,
)
from conveyor.cli.output import (
    console,
    counts_view,
    job_view,
    jobs_table,
    print_json,
    progress,
    when,
)
from conveyor.cli.signals import waiting_of, waiting_view
from conveyor.cli.why import why_dict, why_view
from conveyor.errors import ConveyorError, JobStateError
from conveyor.expiry import is_expired
from conveyor.export import event_dict, job_dict, step_dict
from conveyor.fair import job_fair_key
from conveyor.job import (
    DETAILED_STATES,
    MAX_ATTEMPTS_LIMIT,
    WAITING_STATES,
    JobState,
    resolve_run_at,
    utcnow,
    validate_max_attempts,
    validate_priority,
)
from conveyor.signals import spawned
from conveyor.store.dsn import DSN_ENV, default_dsn, sqlite_path
from conveyor.store.expiring import deadline_of
from conveyor.store.retaining import RetainingStore, kept_for
from conveyor.task import EnqueueOptions, Task

#: Calls per transaction when enqueueing from a file or with --count.
ENQUEUE_BATCH = 1000
#: Copies one ``enqueue --count`` makes at most (run it again for more).
MAX_COUNT = 1_000_000


@click.command()
@click.argument("task")
@click.option("--args", "args", type=JsonValue(list), default="[]", help="JSON array.")
@click.option("--kwargs", "kwargs", type=JsonValue(dict), default="{}", help="JSON object.")
@click.option("--queue", default=None, help="Queue (default: the task's, else 'default').")
@click.option("--key", default=None, help="Idempotency key: no second live job with it.")
@click.option("--group", default=None, help="Ordering key: one job of a group at a time.")
@click.option("--limit-key", default=None, help="The key a per-key limit counts the job under.")
@click.option(
    "--delay",
    type=Duration(lambda seconds: resolve_run_at(utcnow(), seconds, None)),
    default=None,
    help="Run later: 90s, 30m, 2h...",
)
@click.option(
    "--priority",
    type=Bounded(click.INT, validate_priority),
    default=None,
    help="Higher runs first (a 32-bit integer).",
)
@click.option(
    "--max-attempts",
    type=Bounded(click.INT, validate_max_attempts),
    default=None,
    help=f"Attempts before it fails for good (1 to {MAX_ATTEMPTS_LIMIT:,}).",
)
@click.option(
    "--count",
    type=Bounded(click.INT, within("--count", 1, MAX_COUNT)),
    default=1,
    help=f"Enqueue this many copies (at most {MAX_COUNT:,} a command).",
)
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
@click.option(
    "--any-task",
    is_flag=True,
    help="Enqueue TASK even if neither --app nor the database knows its name.",
)
@dsn_option
@json_option
def enqueue(
    task: str,
    args: list[Any],
    kwargs: dict[str, Any],
    count: int,
    calls_file: Any,
    app_path: str | None,
    any_task: bool,
    dsn: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Enqueue jobs of TASK by name (the handler's code is not needed here).

    The name must be known, so a typo does not make jobs no worker runs: a task
    of the App given with --app, or else one the database has seen (among its
    newest 5,000 jobs, or a periodic task). --any-task enqueues any name.

    Without --app, the job goes to --queue, else to 'default', whatever queue the
    task is registered on: give one or the other.
    """
    registry = _registry(app_path, dsn)
    if registry is not None and task not in registry and not any_task:
        raise click.BadParameter(
            f"{app_path} has no task {task!r}{_near(task, registry)}; "
            f"it has: {', '.join(sorted(registry)) or 'none'} "
            "(--any-task enqueues it anyway)",
            param_hint="TASK",
        )
    if registry is None and not any_task:
        _check_known(task, dsn)
    # The other options (--queue, --key, --group, --limit-key, --delay, --priority,
    # --max-attempts) are named after EnqueueOptions' fields, and go as given.
    opts = EnqueueOptions(**options)
    if calls_file is not None:
        calls: Iterator[tuple[list[Any], dict[str, Any]]] = _calls_from_file(calls_file)
        total = None
    else:
        calls = itertools.repeat((args, kwargs), count)
        total = count
    ids: list[int] = []
    existing = None
    with (
        open_app(dsn, must_exist=False) as app,
        progress(f"enqueueing {task}", total) as advance,
    ):
        if registry is not None:
            # The task's defaults come from its registration; its handler never runs here.
            app.tasks.update(registry)
        batch: list[tuple[list[Any], dict[str, Any]]] = []

        def flush() -> None:
            nonlocal existing
            for job in app.enqueue_calls(task, batch, opts):
                ids.append(job.id)
                existing = job if job.existing else existing
            advance(len(batch))
            batch.clear()

        for call in calls:
            if registry is not None and task in registry:
                registry[task].check_arguments(*call)
            batch.append(call)
            if len(batch) == ENQUEUE_BATCH:
                flush()
        if batch:
            flush()
        if as_json:
            if len(ids) == 1:
                print_json({**job_dict(app.get(ids[0])), "existing": existing is not None})
            else:
                print_json({"task": task, "count": len(ids), "ids": ids})
            return
    if existing is not None:
        # The key is per queue: a live job holds it, so that job stands for this enqueue.
        click.echo(
            f"not enqueued: job {existing.id} ({existing.task}, {existing.detailed_state()}, "
            f"created {when(existing.created_at)}) holds key {existing.key!r} in queue "
            f"{existing.queue}; that job stands for this one"
        )
        return
    if len(ids) == 1:
        click.echo(f"enqueued job {ids[0]} ({task})")
    else:
        click.echo(f"enqueued {len(ids):,} jobs of {task} (ids {min(ids)}..{max(ids)})")


def _near(task: str, known: Iterable[str]) -> str:
    """``: did you mean send_mail?`` for the names close to ``task``, or ""."""
    near = difflib.get_close_matches(task, list(known), n=3, cutoff=0.6)
    return f": did you mean {' or '.join(near)}?" if near else ""


def _check_known(task: str, dsn: str | None) -> None:
    """Refuse a task name the database has not seen (a typo), naming the close ones."""
    resolved = dsn if dsn is not None else default_dsn()
    if resolved.startswith("sqlite:") and not sqlite_path(resolved).exists():
        known: set[str] = set()  # not created just to be told that it knows nothing
    else:
        with open_app(dsn, must_exist=False) as app:
            known = app.known_tasks()
    if task in known:
        return
    if not known:
        raise click.BadParameter(
            f"no task is known yet: the database has no jobs and no periodic tasks. Check "
            f"{task!r} against your tasks with --app MODULE:APP, or pass --any-task",
            param_hint="TASK",
        )
    raise click.BadParameter(
        f"no task {task!r} is known here{_near(task, known)} (known: the tasks of the "
        f"database's newest {KNOWN_TASKS_READ:,} jobs and its periodic tasks, "
        f"{len(known)} in all). Pass --any-task to enqueue it anyway, or --app MODULE:APP "
        "to check it against your App",
        param_hint="TASK",
    )


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
    """List, count, show, retry, cancel, delete and run jobs, one by one or in bulk."""


@jobs.command("list")
@selection_options
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--before", "before_id", type=JobId(), default=None, help="Next page: ids below this."
)
@dsn_option
@json_option
def list_jobs(
    limit: int, before_id: int | None, dsn: str | None, as_json: bool, **filters: str | None
) -> None:
    """Jobs, newest first (--state scheduled: due later; retrying: after a failed attempt)."""
    chosen = given(filters)
    with open_app(dsn) as app:
        found = app.jobs(limit=limit, before_id=before_id, **chosen)
        matching = None if as_json else app.count_matching(**chosen)
    if as_json:
        print_json([job_dict(job) for job in found])
        return
    if not found:
        click.echo(f"no jobs match{' below id ' + str(before_id) if before_id else ''}")
        return
    console().print(jobs_table(found))
    what = "job matches" if matching == 1 else "jobs match"
    shown = f"showing {len(found):,}" + (f" below id {before_id}" if before_id else "")
    click.echo(f"{matching:,} {what}; {shown}")
    if len(found) == limit:
        click.echo(f"more: --before {found[-1].id}")


@jobs.command("count")
@selection_options
@dsn_option
@json_option
def count_jobs(dsn: str | None, as_json: bool, **filters: str | None) -> None:
    """How many jobs match, per state (a group's jobs: --group NAME)."""
    with open_app(dsn) as app:
        counts = app.count_jobs(None, **given(filters))
    if as_json:
        print_json({state: counts.get(state, 0) for state in DETAILED_STATES})
        return
    console().print(counts_view(counts))


@jobs.command("show")
@click.argument("job_id", type=JobId())
@dsn_option
@json_option
def show_job(job_id: int, dsn: str | None, as_json: bool) -> None:
    """A job: payload, result, error with traceback, its event timeline and durable steps."""
    with open_app(dsn) as app:
        job = app.get(job_id)
        events = app.events(job_id)
        parents, children = app.parents(job_id), app.children(job_id)
        steps = app.steps(job_id) if app.capabilities().steps else []
        why = app.why(job_id) if job.state in (JobState.WAITING, JobState.QUEUED) else None
        waits = waiting_of(app, job_id) if job.state == JobState.QUEUED else None
        expires_at = deadline_of(app.expiry, job_id)
        kept = kept_for(app.port(RetainingStore), job_id)
        fair_key = job_fair_key(app, job_id)
    if as_json:
        print_json(
            {
                **job_dict(job),
                "after": [p.id for p in parents],
                "children": [c.id for c in children],
                "events": [event_dict(e) for e in events],
                "steps": [step_dict(s) for s in steps],
                "why": why_dict(why) if why is not None else None,
                "waiting": waits,
                "spawned": spawned(steps),
                "expires_at": expires_at.isoformat() if expires_at else None,
                "expired": is_expired(job),
                "retain": {s: a.total_seconds() for s, a in kept.items()} if kept else None,
                "fair_key": fair_key,
            }
        )
        return
    console().print(job_view(job, events, steps, parents, children, expires_at, kept))
    if fair_key is not None:  # its own, not its limit_key ("": the shared key)
        console().print(Text("fair key: ", style="bold") + Text(fair_key or "(shared)"))
    if waits is not None:
        console().print(Text(""), waiting_view(waits))
    if spawned(steps):
        console().print(Text("spawned: ", style="bold") + Text(", ".join(map(str, spawned(steps)))))
    if why is not None:
        console().print(Text(""), why_view(why))


# --- acting on jobs, one or many -----------------------------------------------------------


@dataclass(frozen=True)
class BulkAction:
    """What ``conveyor jobs <name>`` does to the jobs it names."""

    name: str
    #: The App method that acts: app.<method>(ids, on_batch=..., **filters).
    method: str
    #: The detailed states it changes; jobs in others stay as they are.
    applies_to: tuple[str, ...]
    #: "retried", "cancelled"...: what happened to the jobs it changed.
    past: str
    help: str


BULK = {
    action.name: action
    for action in (
        BulkAction(
            "retry",
            "retry_jobs",
            ("failed", "cancelled"),
            "queued again",
            "Queue failed or cancelled jobs again (attempts reset).",
        ),
        BulkAction(
            "cancel",
            "cancel_jobs",
            (*WAITING_STATES, "running"),
            "cancelled or asked to stop",
            "Cancel queued jobs; ask the workers of running ones to stop them.",
        ),
        BulkAction(
            "delete",
            "delete_jobs",
            (*WAITING_STATES, "succeeded", "failed", "cancelled"),
            "deleted",
            "Delete jobs and their history (running jobs stay: cancel them first).",
        ),
        BulkAction(
            "run-now",
            "run_jobs_now",
            ("scheduled", "retrying"),
            "made due now",
            "Run scheduled or retrying jobs now instead of at their time.",
        ),
        BulkAction(
            "hold",
            "hold_jobs",
            WAITING_STATES,
            "held",
            "Hold queued jobs back: no worker claims them until unhold (running ones stay).",
        ),
        BulkAction(
            "unhold",
            "unhold_jobs",
            ("scheduled",),
            "let go",
            "Let held jobs go: due again at the time they had (or now).",
        ),
        BulkAction(
            "take-back",
            "take_back",
            ("running",),
            "taken back",
            "Requeue now the running jobs of a dead worker or consumer (e.g. --group).",
        ),
    )
}


def _act(
    action: BulkAction,
    job_ids: tuple[int, ...],
    filters: dict[str, str],
    yes: bool,
    dry_run: bool,
    dsn: str | None,
) -> None:
    """Count what the ids and filters name, say it, ask (for filters), then act in batches."""
    if not job_ids and not filters:
        raise click.UsageError(
            f"name the jobs to {action.name}: JOB_ID..., or filters such as --state, --queue, "
            "--group, --task, --error (see --help)"
        )
    with open_app(dsn) as app:
        if len(job_ids) == 1 and not filters and not dry_run:
            click.echo(_act_on_one(app, action, job_ids[0]))
            record_cli(app, _audit_name(action), f"job {job_ids[0]}", 1)
            return
        counts = app.count_jobs(list(job_ids) or None, **filters)
        matching = sum(counts.values())
        if not matching and "queue" in filters:
            _check_queue(app, filters["queue"])
        changing = sum(counts.get(state, 0) for state in action.applies_to)
        found = ", ".join(f"{state} {n:,}" for state, n in counts.items()) or "none"
        click.echo(f"{matching:,} job(s) match ({found}); {changing:,} can be {action.past}")
        if dry_run or changing == 0:
            return
        if filters and not yes:
            try:
                click.confirm(f"{action.name} {changing:,} job(s)?", abort=True, err=True)
            except click.Abort:
                raise ConveyorError(
                    "not confirmed: nothing changed (--yes acts without asking)"
                ) from None
        act = getattr(app, action.method)
        with progress(action.name, changing) as advance:
            changed = act(list(job_ids) or None, on_batch=advance, **filters)
        record_cli(app, _audit_name(action), _audit_target(job_ids, filters), changed)
    click.echo(f"{changed:,} job(s) {action.past}")


def _check_queue(app: App, queue: str) -> None:
    """A queue the store does not know is a typo more often than an empty queue: say so."""
    known = app.queue_names()
    if queue not in known:
        listed = ", ".join(sorted(known)[:20]) or "none yet"
        raise ConveyorError(f"there is no queue {queue!r} (queues: {listed})")


def _audit_name(action: BulkAction) -> str:
    return action.name.replace("-", " ")  # as the dashboard names it: "run now", "take back"


def _audit_target(job_ids: tuple[int, ...], filters: dict[str, str]) -> str:
    shown = ", ".join(str(i) for i in job_ids[:20]) + (", …" if len(job_ids) > 20 else "")
    named = f"jobs {shown}" if job_ids else "jobs"
    return named + (f" matching {urlencode(filters)}" if filters else "")


def _act_on_one(app: App, action: BulkAction, job_id: int) -> str:
    """One job, with what became of it (or why nothing did) in the words of its state."""
    if action.name == "retry":
        job = app.retry(job_id)
        return f"job {job.id} queued again ({job.task} on {job.queue})"
    if action.name == "cancel":
        job = app.cancel(job_id)
        if job.state == JobState.CANCELLED:
            return f"job {job.id} cancelled"
        if job.cancel_requested and job.state == JobState.RUNNING:
            return f"job {job.id} is running: its worker was asked to stop it"
        raise ConveyorError(f"job {job.id} is already {job.state}; nothing to cancel")
    if action.name in ("hold", "unhold"):
        # JobStateError says why a job cannot be held (or is not held).
        job = app.hold(job_id) if action.name == "hold" else app.unhold(job_id)
        if job.held:
            return f"job {job.id} held: no worker claims it until `conveyor jobs unhold {job.id}`"
        return f"job {job.id} let go: due {job.run_at:%Y-%m-%d %H:%M:%S} UTC"
    state = app.get(job_id).detailed_state()
    if state not in action.applies_to:
        raise JobStateError(
            f"job {job_id} is {state}; {action.name} applies to "
            f"{' or '.join(action.applies_to)} jobs"
        )
    changed = getattr(app, action.method)([job_id])
    if not changed:
        raise JobStateError(f"job {job_id} changed meanwhile: nothing done (look again)")
    return f"job {job_id} {action.past}"


def _bulk_command(action: BulkAction) -> click.Command:
    @click.argument("job_ids", metavar="[JOB_ID]...", type=JobId(), nargs=-1)
    @selection_options
    @click.option("--yes", "-y", is_flag=True, help="Act on the filter's jobs without asking.")
    @click.option("--dry-run", is_flag=True, help="Count the jobs it would change; change none.")
    @dsn_option
    def command(
        job_ids: tuple[int, ...], yes: bool, dry_run: bool, dsn: str | None, **filters: str | None
    ) -> None:
        _act(action, job_ids, given(filters), yes, dry_run, dsn)

    command.__doc__ = (
        f"{action.help}\n\nName the jobs by JOB_ID, or by filters: every job matching them "
        "(counted first, then confirmed unless --yes)."
    )
    return jobs.command(action.name)(command)


for _action in BULK.values():
    if _action.name != "retry":
        _bulk_command(_action)


@jobs.command("retry")
@click.argument("job_ids", metavar="[JOB_ID]...", type=JobId(), nargs=-1)
@click.option("--all-failed", is_flag=True, help="Every failed job (same as --state failed).")
@selection_options
@click.option("--yes", "-y", is_flag=True, help="Act on the filter's jobs without asking.")
@click.option("--dry-run", is_flag=True, help="Count the jobs it would change; change none.")
@dsn_option
def retry_jobs(
    job_ids: tuple[int, ...],
    all_failed: bool,
    yes: bool,
    dry_run: bool,
    dsn: str | None,
    **filters: str | None,
) -> None:
    """Queue failed or cancelled jobs again (attempts reset).

    Name the jobs by JOB_ID, or by filters: every job matching them (counted
    first, then confirmed unless --yes). Of several failed jobs with one key only
    the newest goes back, and none while a live job holds the key.
    """
    chosen = given(filters)
    if all_failed:
        if job_ids:
            raise click.UsageError("give JOB_IDs or --all-failed, not both")
        if chosen.get("state", "failed") != "failed":
            raise click.UsageError("--all-failed means --state failed")
        chosen["state"] = "failed"
    _act(BULK["retry"], job_ids, chosen, yes, dry_run, dsn)
