"""``conveyor demo``: a mixed workload on two worker processes, one of which is killed.

What it shows, on the embedded SQLite default and nothing else installed:
jobs of three queues enqueued in bulk, two ``conveyor worker`` processes
sharing them, one killed with SIGKILL while it holds jobs, its leases
expiring and the other worker's rescuer requeueing those jobs, and the
other worker finishing everything. The database is left for ``conveyor
stats``, ``conveyor jobs ...``, the dashboard and the Spark report.
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.text import Text

from conveyor.app import App
from conveyor.cli.demo_tasks import REMINDER_DELAY, register
from conveyor.cli.options import Bounded, within
from conveyor.cli.output import console, interactive, progress, stats_view
from conveyor.errors import ConfigurationError
from conveyor.job import JobState
from conveyor.store.dsn import sqlite_path

DEFAULT_DEMO_DSN = "sqlite:///conveyor-demo.db"
#: Gives up waiting for the workload after this long (the demo normally takes well under it).
DEADLINE = 100.0
#: Fraction of the workload done when the first worker is killed.
KILL_AT = 0.4
REFRESH = 0.2


@dataclass
class Workload:
    """How many jobs of each kind: about 1% fail for good, 5% retry, 1% stay deferred."""

    total: int
    reports: int = 0
    partner_calls: int = 0
    declined_charges: int = 0
    device_updates: int = 0
    reminders: int = 0
    rate_fetches: int = 0
    thumbnails: int = 0

    def __post_init__(self) -> None:
        n = self.total
        self.reports = max(6, n // 1000)
        self.partner_calls = max(10, n // 20)
        self.declined_charges = max(5, n // 100)
        self.device_updates = max(10, min(200, n // 100))
        self.reminders = max(5, n // 100)
        self.rate_fetches = max(3, n // 1000)
        rest = n - (
            self.reports
            + self.partner_calls
            + self.declined_charges
            + self.device_updates
            + self.reminders
            + self.rate_fetches
        )
        if rest < 0:
            raise ConfigurationError(f"--jobs {n} is too few for the demo's mix; use 200 or more")
        self.thumbnails = rest

    def per_queue(self) -> dict[str, int]:
        """Jobs each queue will finish (the reminders and rate fetches wait past the demo)."""
        return {
            "images": self.thumbnails,
            "reports": self.reports,
            "integrations": self.partner_calls + self.declined_charges + self.device_updates,
        }


@dataclass
class WorkerProcess:
    number: int
    process: subprocess.Popen[bytes]
    killed_at: float | None = None
    #: Jobs it held when it was killed.
    held: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid


def enqueue_workload(app: App, work: Workload) -> None:
    tasks = app.tasks
    batches: list[tuple[str, Any, list[tuple[list[Any], dict[str, Any]]]]] = [
        (
            # First in their queue, so their first attempt is over well before the end.
            "fetch_rates",
            tasks["fetch_rates"].options(),
            [([f"C{i:02d}"], {}) for i in range(work.rate_fetches)],
        ),
        (
            "render_report",
            tasks["render_report"].options(),
            [([i, 2.0 + (i % 5) * 0.5], {}) for i in range(work.reports)],
        ),
        (
            "sync_device",
            tasks["sync_device"].options(group="device:sensor-42"),
            [(["sensor-42", i], {}) for i in range(work.device_updates)],
        ),
        (
            "call_partner",
            tasks["call_partner"].options(),
            [([i], {}) for i in range(work.partner_calls)],
        ),
        (
            "charge_card",
            tasks["charge_card"].options(),
            [([f"c{i:05d}", 1999 + i], {}) for i in range(work.declined_charges)],
        ),
        (
            "send_reminder",
            tasks["send_reminder"].options(delay=REMINDER_DELAY),
            [([f"user-{i}"], {}) for i in range(work.reminders)],
        ),
        (
            "thumbnail",
            tasks["thumbnail"].options(),
            [([i], {"size": (64, 128, 256)[i % 3]}) for i in range(work.thumbnails)],
        ),
    ]
    with progress("enqueueing", work.total) as advance:
        for _name, bound, calls in batches:
            for start in range(0, len(calls), 1000):
                chunk = calls[start : start + 1000]
                bound.enqueue_many(chunk)
                advance(len(chunk))


def start_worker(number: int, dsn: str, lease: float, concurrency: int, log: IO[str]) -> Any:
    command = [
        sys.executable, "-m", "conveyor", "worker", "conveyor.cli.demo_tasks:app",
        "--dsn", dsn, "--concurrency", str(concurrency), "--lease", str(lease),
        "--stop-timeout", "5", "--log-level", "WARNING",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    return WorkerProcess(number, process)


def held_by(app: App, pid: int) -> list[int]:
    """Running jobs whose lease belongs to the worker process ``pid`` (its id: host:pid:suffix)."""
    running = app.jobs(state=JobState.RUNNING, limit=10_000)
    return [j.id for j in running if j.worker and j.worker.rsplit(":", 2)[-2:-1] == [str(pid)]]


class Display:
    """The live view on a terminal; plain milestone lines otherwise."""

    def __init__(self, work: Workload, show: bool) -> None:
        self.show = show
        self.bars = Progress(
            TextColumn("{task.description:>14}"),
            BarColumn(bar_width=40),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
        )
        self.tasks: dict[str, TaskID] = {
            queue: self.bars.add_task(queue, total=count, note="")
            for queue, count in work.per_queue().items()
        }
        self.overall = self.bars.add_task("all", total=sum(work.per_queue().values()), note="")
        self.lines: list[str] = []
        self.workers: list[str] = []
        self.live: Live | None = None

    def __enter__(self) -> Display:
        if self.show:
            self.live = Live(self.render(), console=Console(), refresh_per_second=10)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self.render())
            self.live.__exit__(None, None, None)

    def say(self, line: str) -> None:
        self.lines.append(line)
        if not self.show:
            click.echo(line)
        self.refresh()

    def update(self, done: dict[str, int], notes: dict[str, str], workers: list[str]) -> None:
        for queue, task in self.tasks.items():
            self.bars.update(task, completed=done.get(queue, 0), note=notes.get(queue, ""))
        self.bars.update(self.overall, completed=sum(done.values()))
        self.workers = workers
        self.refresh()

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.render())

    def render(self) -> RenderableType:
        parts: list[RenderableType] = [self.bars, Text("")]
        parts.extend(Text(w) for w in self.workers)
        parts.extend(Text(line, style="bold") for line in self.lines[-8:])
        return Group(*parts)


def _finished_per_queue(app: App) -> dict[str, int]:
    stats = app.stats()
    return {
        name: sum(q.counts.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
        for name, q in stats.queues.items()
    }


def _prepare_database(dsn: str, default: bool) -> None:
    """The demo's own file starts afresh; any other database must hold no jobs yet."""
    if dsn.startswith("sqlite:"):
        path = sqlite_path(dsn)
        if default:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)
    with App(dsn) as app:
        app.migrate()
        existing = sum(app.stats().count(s) for s in JobState)
    if existing:
        raise ConfigurationError(
            f"{dsn} already holds {existing} jobs; the demo needs an empty database "
            "(leave out --dsn to use ./conveyor-demo.db)"
        )


def run_demo(dsn: str | None, total: int, lease: float, concurrency: int, report: bool) -> None:
    started = time.monotonic()
    chosen = dsn or DEFAULT_DEMO_DSN
    show = interactive()
    out = console()
    work = Workload(total)
    _prepare_database(chosen, default=dsn is None)
    if chosen.startswith("sqlite:"):
        log_path = Path(f"{sqlite_path(chosen)}.workers.log")
    else:
        log_path = Path("conveyor-demo.workers.log")
    out.print(f"[bold]conveyor demo[/bold] on {chosen}")
    with App(chosen) as app:
        register(app)
        enqueue_workload(app, work)
        click.echo(
            f"enqueued {work.total:,} jobs: {work.thumbnails:,} thumbnails, {work.reports} "
            f"slow reports, {work.partner_calls} flaky partner calls, {work.declined_charges} "
            f"declined charges, {work.device_updates} ordered device updates, "
            f"{work.reminders} reminders deferred by an hour, {work.rate_fetches} rate fetches "
            "that will be retrying"
        )
        with open(log_path, "w") as log:
            workers = [start_worker(1, chosen, lease, concurrency, log)]
            try:
                # Worker 2 starts once worker 1 holds jobs, so that worker 1 is sure to
                # have some (the slow reports, enqueued first) when it is killed, even
                # in a small run whose quick jobs are gone in a second.
                _wait_for_claims(app, workers[0])
                workers.append(start_worker(2, chosen, lease, concurrency, log))
                _supervise(app, work, workers, lease, show)
            finally:
                for w in workers:
                    if w.process.poll() is None:
                        w.process.send_signal(signal.SIGTERM)
                for w in workers:
                    try:
                        w.process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        w.process.kill()
                        w.process.wait()
        out.print()
        out.print(stats_view(app.stats(), app.workers()))
        _summary(app, chosen, workers, work, started)
    _report(chosen, report)
    click.echo(next_steps(chosen, log_path))


def program() -> str:
    """How to run ``conveyor`` in a new shell: as a word when the PATH finds this one.

    A fresh virtual environment is not on the PATH of the shell that made it, so
    the commands the demo prints name the script of the environment it runs in.
    """
    here = Path(sys.executable).parent / "conveyor"
    found = shutil.which("conveyor")
    if found is not None and (not here.exists() or Path(found).resolve() == here.resolve()):
        return "conveyor"
    if not here.exists():
        return f"{sys.executable} -m conveyor"
    try:
        return str(here.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(here.absolute())


def next_steps(dsn: str, log_path: Path) -> str:
    """The commands to read the demo's database further, each runnable as printed."""
    run = program()
    if importlib.util.find_spec("starlette") and importlib.util.find_spec("uvicorn"):
        dashboard = (
            f"{run} dashboard --dsn {dsn}   (then http://127.0.0.1:8080/jobs?state=retrying)"
        )
    else:
        dashboard = (
            f"pip install 'conveyor[web]', then: {run} dashboard --dsn {dsn}   "
            "(this environment lacks the web extra)"
        )
    return (
        f"\nEvery state, per queue:  {run} stats --dsn {dsn}\n"
        f"Waiting out a backoff:   {run} jobs list --state retrying --dsn {dsn}\n"
        f"  ...run them now:       {run} jobs run-now --state retrying --dsn {dsn}\n"
        f"Due later:               {run} jobs list --state scheduled --dsn {dsn}\n"
        f"Failed for good:         {run} jobs list --state failed --dsn {dsn}\n"
        f"Open the dashboard:      {dashboard}\n"
        f"Worker logs:             {log_path}"
    )


def _wait_for_claims(app: App, w: WorkerProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not held_by(app, w.pid):
        if w.process.poll() is not None:
            raise click.ClickException(f"worker 1 exited at once (code {w.process.returncode})")
        if time.monotonic() > deadline:
            raise click.ClickException(f"worker 1 claimed nothing in {timeout:g}s")
        time.sleep(0.05)


def _supervise(
    app: App, work: Workload, workers: list[WorkerProcess], lease: float, show: bool
) -> None:
    """Watch the workload, kill worker 1 midway, and wait until its jobs are rescued and done."""
    first, second = workers
    goal = sum(work.per_queue().values())
    deadline = time.monotonic() + DEADLINE
    with Display(work, show) as display:
        display.say(f"started worker 1 (pid {first.pid}) and worker 2 (pid {second.pid})")
        rescued_reported = False
        while True:
            done = _finished_per_queue(app)
            finished = sum(done.values())
            for w in workers:
                if w.killed_at is None and w.process.poll() is not None:
                    raise click.ClickException(
                        f"worker {w.number} exited on its own (code {w.process.returncode}); "
                        "see its log"
                    )
            if first.killed_at is None and finished >= KILL_AT * goal:
                held = held_by(app, first.pid)
                if held or finished >= goal:
                    first.process.send_signal(signal.SIGKILL)
                    first.process.wait()
                    first.killed_at = time.monotonic()
                    # Dead now: what it held stays running until its leases expire.
                    first.held = held_by(app, first.pid)
                    display.say(
                        f"killed worker 1 (pid {first.pid}) with SIGKILL at "
                        f"{finished / goal:.0%}: it held {len(first.held)} running job(s); "
                        f"their leases expire within {lease:g}s"
                    )
            rescued, settled = _rescue_progress(app, first)
            all_back = bool(first.held) and rescued == settled == len(first.held)
            if first.killed_at is not None and all_back and not rescued_reported:
                display.say(
                    f"worker 2 rescued all {rescued} job(s) of worker 1 after their leases "
                    f"expired and finished them ({time.monotonic() - first.killed_at:.1f}s "
                    "after the kill)"
                )
                rescued_reported = True
            display.update(
                done,
                {},
                [
                    _worker_line(app, first, rescued, settled),
                    _worker_line(app, second, rescued, settled),
                ],
            )
            if (
                first.killed_at is not None
                and finished >= goal
                and (rescued_reported or not first.held)
                and app.stats().count("retrying") >= work.rate_fetches
            ):
                display.say(f"all {goal:,} jobs that were due are finished")
                return
            if time.monotonic() > deadline:
                display.say("stopped waiting: the workload did not finish in time")
                return
            time.sleep(REFRESH)


def _rescue_progress(app: App, killed: WorkerProcess) -> tuple[int, int]:
    """How many of the killed worker's jobs were rescued, and how many of those ended."""
    if not killed.held:
        return 0, 0
    rescued = settled = 0
    for job_id in killed.held:
        if any(e.kind == "rescued" for e in app.events(job_id)):
            rescued += 1
            if app.get(job_id).terminal:
                settled += 1
    return rescued, settled


def _worker_line(app: App, w: WorkerProcess, rescued: int, settled: int) -> str:
    if w.killed_at is not None:
        return (
            f"worker {w.number} (pid {w.pid}): killed holding {len(w.held)} job(s); "
            f"{rescued} rescued, {settled} of them finished by worker 2"
        )
    return f"worker {w.number} (pid {w.pid}): running, {len(held_by(app, w.pid))} job(s) in hand"


def _summary(
    app: App, dsn: str, workers: list[WorkerProcess], work: Workload, started: float
) -> None:
    stats = app.stats()
    killed = workers[0]
    click.echo(
        f"\nsucceeded {stats.count('succeeded'):,}, failed for good {stats.count('failed'):,} "
        f"(declined cards, with their tracebacks), scheduled {stats.count('scheduled'):,} "
        f"(reminders deferred by an hour), retrying {stats.count('retrying'):,} (rate fetches "
        f"whose next attempt is 15 minutes away), in {time.monotonic() - started:.1f}s"
    )
    if killed.held:
        sample = killed.held[0]
        click.echo(
            f"jobs of the killed worker: {', '.join(map(str, killed.held[:10]))}"
            f"{' ...' if len(killed.held) > 10 else ''}; "
            f"see one with: {program()} jobs show {sample} --dsn {_shown_dsn(dsn)}"
        )
        click.echo(
            f"(worker 1, pid {killed.pid}, stays in the list of workers, marked probably dead "
            "once silent for 30 s, until the others forget it after a minute: a killed "
            "process cannot unregister itself)"
        )


def _shown_dsn(dsn: str) -> str:
    """A file's DSN as it is; a server's as the variable that holds it (not its password)."""
    return dsn if dsn.startswith("sqlite:") else "$CONVEYOR_DSN"


def _report(dsn: str, wanted: bool) -> None:
    if not wanted:
        return
    if importlib.util.find_spec("pyspark") is None:
        click.echo(
            "\nThe Spark report needs the spark extra: pip install 'conveyor[spark]', "
            f"then: {program()} report --dsn {dsn}"
        )
        return
    try:
        has_report = importlib.util.find_spec("conveyor.spark.analytics") is not None
    except ImportError:
        has_report = False
    if not has_report:
        click.echo(
            "\nThis installation of conveyor has no Spark report (conveyor.spark.analytics)."
        )
        return
    click.echo("\nSpark report (conveyor report):")
    sys.stdout.flush()
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", "report", "--dsn", dsn],
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if result.returncode != 0:
        click.echo(f"the report failed (exit code {result.returncode})")


@click.command()
@click.option(
    "--dsn",
    default=None,
    help=f"Database to fill (must hold no jobs). Default: {DEFAULT_DEMO_DSN}, made afresh.",
)
@click.option(
    "--jobs",
    "total",
    type=Bounded(click.INT, within("--jobs", 200, 1_000_000)),
    default=20_000,
    show_default=True,
)
@click.option(
    "--lease",
    type=Bounded(click.FLOAT, within("--lease", 0.5, 3600, " seconds")),
    default=3.0,
    show_default=True,
)
@click.option(
    "--concurrency",
    type=Bounded(click.INT, within("--concurrency", 1, 1000)),
    default=16,
    show_default=True,
)
@click.option("--report/--no-report", default=True, help="Run the Spark report at the end.")
def demo(dsn: str | None, total: int, lease: float, concurrency: int, report: bool) -> None:
    """Run a mixed workload on two workers, kill one, and watch the other recover its jobs."""
    if dsn is None:
        # ``conveyor --dsn X demo``: the option given before the command. ($CONVEYOR_DSN
        # alone is not enough: the demo's own file is the default, not your database.)
        dsn = click.get_current_context().find_root().params.get("dsn")
    run_demo(dsn, total, lease, concurrency, report)
