"""The conveyor command against real databases: SQLite files and a PostgreSQL server.

Commands run in-process through click's CliRunner (stdout and stderr apart),
except where the process boundary is the point (the worker, piped output).
Jobs are finished through conveyor.testing's drain, the real claim/complete path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from conveyor import App, JobState
from conveyor.cli import cli
from conveyor.cli.group import ConveyorGroup, LazyCommand
from conveyor.cli.options import parse_duration
from conveyor.job import utcnow
from conveyor.testing import drain


def run(*args: str, code: int = 0, stdin: str | None = None) -> Result:
    result = CliRunner().invoke(cli, list(args), input=stdin)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json").stdout)


def one_line_error(result: Result) -> str:
    """The error a failed command printed: exactly one line on stderr, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


@pytest.fixture
def db(app: App, dsn: str) -> Iterator[tuple[App, str]]:
    """A migrated App and the DSN the commands get, with tasks that succeed and fail."""

    @app.task(queue="math")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(queue="math", max_attempts=1)
    def explode(reason: str) -> None:
        raise RuntimeError(f"exploded: {reason}")

    @app.task(queue="other", max_attempts=1)
    def explode_other() -> None:
        raise RuntimeError("other queue failure")

    yield app, dsn


# --- enqueue, list, show ----------------------------------------------------------------


def test_enqueue_by_name_with_every_option_then_list_and_show(db: tuple[App, str]) -> None:
    app, dsn = db
    job = run_json(
        "enqueue", "add", "--args", "[1, 2]", "--kwargs", '{"note": "x"}', "--queue", "q1",
        "--key", "k1", "--group", "g1", "--delay", "90s", "--priority", "5",
        "--max-attempts", "7", "--any-task", "--dsn", dsn,
    )  # fmt: skip
    assert job["task"] == "add" and job["queue"] == "q1" and job["state"] == "queued"
    assert job["args"] == [1, 2] and job["kwargs"] == {"note": "x"}
    assert (job["key"], job["group"], job["priority"], job["max_attempts"]) == ("k1", "g1", 5, 7)
    stored = app.get(job["id"])
    delay = (stored.run_at - stored.created_at).total_seconds()
    assert 89.9 < delay < 90.1
    # Same key while the first is live: the same job comes back.
    again = run("enqueue", "add", "--args", "[9, 9]", "--queue", "q1", "--key", "k1", "--dsn", dsn)
    assert again.stdout.startswith(f"not enqueued: job {job['id']} (add, scheduled, created ")
    assert "holds key 'k1' in queue q1" in again.stdout
    assert run_json("enqueue", "add", "--queue", "q1", "--key", "k1", "--dsn", dsn)["existing"]

    run("enqueue", "add", "--args", "[3, 4]", "--dsn", dsn)
    listed = run_json("jobs", "list", "--queue", "q1", "--dsn", dsn)
    assert [j["id"] for j in listed] == [job["id"]]
    assert len(run_json("jobs", "list", "--task", "add", "--dsn", dsn)) == 2
    assert run_json("jobs", "list", "--state", "failed", "--dsn", dsn) == []

    shown = run_json("jobs", "show", str(job["id"]), "--dsn", dsn)
    assert shown["id"] == job["id"]
    assert [e["kind"] for e in shown["events"]] == ["enqueued"]

    table = run("jobs", "list", "--dsn", dsn).stdout
    assert str(job["id"]) in table and "scheduled" in table and "ready" in table


def test_list_pages_with_before(db: tuple[App, str]) -> None:
    app, dsn = db
    ids = [app.enqueue("add", [i, i]).id for i in range(5)]
    first = run("jobs", "list", "--limit", "2", "--dsn", dsn).stdout
    assert f"more: --before {ids[3]}" in first
    page = run_json("jobs", "list", "--limit", "2", "--before", str(ids[3]), "--dsn", dsn)
    assert [j["id"] for j in page] == [ids[2], ids[1]]


def test_show_failed_job_prints_traceback_and_timeline(db: tuple[App, str]) -> None:
    app, dsn = db
    job = app.enqueue("explode", ["the reason"])
    assert drain(app, ["math"]) == {"failed": 1}
    out = run("jobs", "show", str(job.id), "--dsn", dsn).stdout
    assert "Traceback (most recent call last)" in out
    assert "RuntimeError: exploded: the reason" in out
    for kind in ("enqueued", "claimed", "failed"):
        assert kind in out
    listed = run("jobs", "list", "--state", "failed", "--dsn", dsn).stdout
    assert "RuntimeError: exploded" in listed  # the error's last line, not "Traceback"


def test_enqueue_many_from_count_and_file(db: tuple[App, str]) -> None:
    app, dsn = db
    result = run_json(
        "enqueue", "add", "--args", "[1, 1]", "--count", "2500", "--any-task", "--dsn", dsn
    )
    assert result["count"] == 2500 and len(set(result["ids"])) == 2500
    lines = "\n".join(json.dumps({"args": [i, 1]}) for i in range(3)) + "\n\n"
    out = run("enqueue", "add", "--file", "-", "--dsn", dsn, stdin=lines).stdout
    assert out.startswith("enqueued 3 jobs of add")
    assert sorted(j.args[0] for j in app.jobs(limit=3)) == [0, 1, 2]
    bad = run("enqueue", "add", "--file", "-", "--dsn", dsn, stdin="{nope\n", code=2)
    assert "line 1 is not JSON" in bad.stderr


# --- operating ---------------------------------------------------------------------


def test_retry_and_cancel_one_job(db: tuple[App, str]) -> None:
    app, dsn = db
    queued = app.enqueue("add", [1, 2])
    assert run("jobs", "cancel", str(queued.id), "--dsn", dsn).stdout.strip() == (
        f"job {queued.id} cancelled"
    )
    assert app.get(queued.id).state == JobState.CANCELLED
    run("jobs", "retry", str(queued.id), "--dsn", dsn)
    retried = app.get(queued.id)
    assert retried.state == JobState.QUEUED and retried.attempts == 0
    # A queued job cannot be retried, a finished one not cancelled: one line each, exit 1.
    refused = run("jobs", "retry", str(queued.id), "--dsn", dsn, code=1)
    assert "only failed or cancelled jobs can be retried" in one_line_error(refused)
    drain(app, ["math"])
    done = run("jobs", "cancel", str(queued.id), "--dsn", dsn, code=1)
    assert "already succeeded" in one_line_error(done)


def test_retry_all_failed_of_one_queue(db: tuple[App, str]) -> None:
    app, dsn = db
    math_jobs = [app.enqueue("explode", [str(i)]).id for i in range(3)]
    other = app.enqueue("explode_other").id
    assert drain(app) == {"failed": 4}
    out = run("jobs", "retry", "--all-failed", "--queue", "math", "--dsn", dsn, "--yes").stdout
    assert out.splitlines() == [
        "3 job(s) match (failed 3); 3 can be queued again",
        "3 job(s) queued again",
    ]
    for job_id in math_jobs:
        job = app.get(job_id)
        assert job.state == JobState.QUEUED and job.attempts == 0 and job.error is None
        assert [e.kind for e in app.events(job_id)][-1] == "manual_retry"
    assert app.get(other).state == JobState.FAILED
    out = run("jobs", "retry", "--all-failed", "--dsn", dsn, stdin="y\n").stdout
    assert out.endswith("1 job(s) queued again\n")
    assert app.get(other).state == JobState.QUEUED
    usage = run("jobs", "retry", "--dsn", dsn, code=2)
    assert "name the jobs to retry: JOB_ID..., or filters" in usage.stderr


def test_retry_failed_keeps_a_key_to_one_live_job(db: tuple[App, str]) -> None:
    """Two failed jobs of one key: only the newest goes back, so one live job holds the key."""
    app, _ = db
    older = app.enqueue("explode", ["a"], key="report-7")
    drain(app, ["math"])
    newer = app.enqueue("explode", ["b"], key="report-7")
    held = app.enqueue("explode", ["c"], key="held")
    drain(app, ["math"])
    live_holder = app.enqueue("add", [1, 1], key="held", queue="math")
    assert app.retry_failed("math") == 1
    assert app.get(newer.id).state == JobState.QUEUED
    assert app.get(older.id).state == JobState.FAILED
    assert app.get(held.id).state == JobState.FAILED
    assert app.get(live_holder.id).state == JobState.QUEUED


def test_retry_failed_leaves_jobs_that_fail_after_it_started(app: App) -> None:
    @app.task(max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    ids = [boom.enqueue().id for _ in range(5)]
    drain(app)
    started = utcnow()
    # Failed at the cutoff or before it: retried; the store is told the cutoff, not "now".
    assert sorted(app.store.job_retry_failed(None, started, started, limit=2)) == ids[:2]
    drain(app)  # the two fail again, after the cutoff
    rest = app.store.job_retry_failed(None, started, utcnow(), limit=100)
    assert sorted(rest) == ids[2:]


def test_purge_pause_resume_and_stats(db: tuple[App, str]) -> None:
    app, dsn = db
    for i in range(3):
        app.enqueue("add", [i, i])
    app.enqueue("add", [0, 0], queue="waiting")
    drain(app, ["math"])
    run("pause", "waiting", "--dsn", dsn)
    app.store.worker_register("w-1", "host-a", 4242, ["math"], 8, utcnow())
    stats = run_json("stats", "--dsn", dsn)
    assert stats["queues"]["math"]["counts"]["succeeded"] == 3
    assert stats["queues"]["waiting"]["paused"] is True
    assert stats["queues"]["waiting"]["counts"]["queued"] == 1
    assert stats["queues"]["waiting"]["oldest_ready_age"] >= 0
    assert stats["finished_last_minute"] == 3
    assert [(w["id"], w["pid"]) for w in stats["workers"]] == [("w-1", 4242)]
    table = run("stats", "--dsn", dsn).stdout
    assert "paused" in table and "host-a" in table and "3 jobs finished" in table
    run("resume", "waiting", "--dsn", dsn)
    assert run_json("stats", "--dsn", dsn)["queues"]["waiting"]["paused"] is False

    assert run("purge", "--older-than", "7d", "--dsn", dsn).stdout.startswith("purged 0 ")
    out = run("purge", "--older-than", "0s", "--dsn", dsn, "--yes").stdout
    assert out.startswith("purged 3 succeeded/failed/cancelled job(s)")
    assert app.stats().count("succeeded") == 0 and app.stats().count("queued") == 1


def test_stats_watch_repeats(db: tuple[App, str]) -> None:
    _, dsn = db
    out = run("stats", "--watch", "--interval", "0.1", "--times", "3", "--dsn", dsn).stdout
    assert out.count("Queues") == 3
    snapshots = run("stats", "--watch", "--json", "--interval", "0.1", "--times", "2", "--dsn", dsn)
    assert snapshots.stdout.count('"finished_last_minute"') == 2


# --- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("mysql://localhost/db", "unsupported DSN"),
        ("postgresql://localhost:99999/db", "port is not a number"),
        ("sqlite:///", "names no file"),
    ],
)
def test_malformed_dsn_is_one_line(dsn: str, expected: str) -> None:
    for command in (["stats"], ["jobs", "list"], ["enqueue", "t"], ["migrate"]):
        result = run(*command, "--dsn", dsn, code=1)
        line = one_line_error(result)
        assert line.startswith("error: ") and expected in line


def test_unreachable_postgres_is_one_line() -> None:
    # Port 1 on loopback: refused at once; the pool keeps trying until its timeout.
    result = run("jobs", "list", "--dsn", "postgresql://u@127.0.0.1:1/db", code=1)
    line = one_line_error(result)
    assert line.startswith("error: cannot connect to PostgreSQL at 127.0.0.1:1/db")


def test_bad_json_arguments_and_durations_are_usage_errors(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'x.db'}"
    bad_json = run("enqueue", "t", "--args", "[1,", "--dsn", dsn, code=2)
    assert "'[1,' is not valid JSON" in bad_json.stderr and "Traceback" not in bad_json.stderr
    not_array = run("enqueue", "t", "--args", '{"a": 1}', "--dsn", dsn, code=2)
    assert "is not a JSON array" in not_array.stderr
    not_object = run("enqueue", "t", "--kwargs", "[1]", "--dsn", dsn, code=2)
    assert "is not a JSON object" in not_object.stderr
    bad_duration = run("purge", "--older-than", "7 days", "--dsn", dsn, code=2)
    assert "is not a duration" in bad_duration.stderr


def test_unknown_job_is_one_line_and_debug_shows_the_traceback(db: tuple[App, str]) -> None:
    _, dsn = db
    for command in (["jobs", "show", "999999"], ["jobs", "retry", "999999"]):
        line = one_line_error(run(*command, "--dsn", dsn, code=1))
        assert line == "error: no job with id 999999" or "no job with id 999999" in line
    result = CliRunner().invoke(cli, ["--debug", "jobs", "show", "999999", "--dsn", dsn])
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "JobNotFoundError"


def test_invalid_enqueue_options_are_one_line(db: tuple[App, str]) -> None:
    _, dsn = db
    result = run("enqueue", "add", "--key", "k", "--count", "2", "--any-task", "--dsn", dsn, code=1)
    assert "key applies to one job" in one_line_error(result)
    empty = run("pause", " ", "--dsn", dsn, code=1)
    assert "queue must not be empty" in one_line_error(empty)


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("24h") == timedelta(hours=24)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("2.5") == timedelta(seconds=2.5)
    for bad in ("", "d", "7x", "1h 30m", "-5m", "5m-"):
        with pytest.raises(ValueError):
            parse_duration(bad)


# --- lazily attached commands --------------------------------------------------------


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real module with one command and one that needs a package that is not installed."""
    name = f"cli_plugin_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "import click\n\n"
        "@click.command()\n"
        "@click.option('--who', default='world')\n"
        "def hello(who):\n"
        "    click.echo(f'hello {who}')\n\n"
        "not_a_command = 42\n"
    )
    (tmp_path / f"{name}_heavy.py").write_text("import surely_not_installed_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_lazy_commands_load_on_use_and_explain_a_missing_extra(plugin_module: str) -> None:
    lazy = {
        "hello": LazyCommand(f"{plugin_module}:hello", "x", ("nothing",), "Say hello."),
        "heavy": LazyCommand(
            f"{plugin_module}_heavy:cmd", "heavy", ("surely_not_installed_pkg",), "Heavy."
        ),
        "broken": LazyCommand(f"{plugin_module}:not_a_command", "x", (), "Broken."),
    }

    @click.group(cls=ConveyorGroup, lazy=lazy)
    @click.option("--debug", is_flag=True)
    def group(debug: bool) -> None:
        pass

    runner = CliRunner()
    listing = runner.invoke(group, ["--help"])
    assert "Say hello." in listing.stdout and "Heavy." in listing.stdout
    assert plugin_module not in sys.modules  # --help imported nothing
    assert runner.invoke(group, ["hello", "--who", "you"]).stdout == "hello you\n"
    heavy = runner.invoke(group, ["heavy", "--any", "option"])
    assert heavy.exit_code == 1
    assert one_line_error(heavy) == (
        "error: the heavy command needs the heavy extra: pip install 'conveyor[heavy]' "
        "(surely_not_installed_pkg is not installed)"
    )
    broken = runner.invoke(group, ["broken"])
    assert broken.exit_code == 1 and "is not a click command" in one_line_error(broken)


def test_extra_commands_are_listed_without_importing_them() -> None:
    # In a fresh interpreter: this test process may have imported them for other tests.
    script = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from conveyor.cli import cli\n"
        "print(CliRunner().invoke(cli, ['--help']).stdout)\n"
        "heavy = ('pyspark', 'starlette', 'conveyor.spark', 'conveyor.web', 'conveyor.cli.demo')\n"
        "print('imported:', sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for name in ("dashboard", "report", "archive", "demo", "jobs", "stats", "worker"):
        assert f"  {name} " in out
    assert "imported: []" in out


# --- across the process boundary ------------------------------------------------------------


def _conveyor(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_worker_runs_the_jobs_of_the_database_named_by_dsn(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'w.db'}"
    env = {"CONVEYOR_DSN": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    enqueued = _conveyor(
        "enqueue",
        "thumbnail",
        "--args",
        "[7]",
        "--queue",
        "images",
        "--json",
        "--any-task",
        "--dsn",
        dsn,
        cwd=tmp_path,
        env=env,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = json.loads(enqueued.stdout)["id"]
    worked = _conveyor(
        "worker", "conveyor.cli.demo_tasks:app", "--burst", "--dsn", dsn, cwd=tmp_path, env=env
    )
    assert worked.returncode == 0, worked.stderr
    with App(dsn) as app:
        job = app.get(job_id)
        assert job.state == JobState.SUCCEEDED and job.result["image"] == 7
    assert not (tmp_path / "elsewhere.db").exists()


def test_long_operations_stay_quiet_when_piped(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'p.db'}"
    result = _conveyor("enqueue", "t", "--count", "3000", "--any-task", "--dsn", dsn, cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.splitlines() == [result.stdout.strip()]
    assert result.stdout.startswith("enqueued 3,000 jobs of t")


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal (a pseudo-terminal here) the same command draws a progress bar."""
    import pty

    dsn = f"sqlite:///{tmp_path / 't.db'}"
    command = [sys.executable, "-m", "conveyor", "enqueue", "t", "--count", "20000", "--any-task"]
    command += ["--dsn", dsn]
    chunks: list[bytes] = []

    def read(fd: int) -> bytes:
        data = os.read(fd, 4096)
        chunks.append(data)
        return data

    status = pty.spawn(command, read)
    assert os.waitstatus_to_exitcode(status) == 0
    output = b"".join(chunks).decode(errors="replace")
    assert "enqueueing t" in output  # the bar's label, drawn while it ran
    assert "enqueued 20,000 jobs of t" in output


def test_enqueue_with_app_takes_the_tasks_defaults_and_checks_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --app puts --dsn in $CONVEYOR_DSN for the App's module; undone after the test.
    monkeypatch.delenv("CONVEYOR_DSN", raising=False)
    dsn = f"sqlite:///{tmp_path / 'a.db'}"
    app_option = ["--app", "conveyor.cli.demo_tasks:app", "--dsn", dsn]
    job = run_json("enqueue", "render_report", "--args", "[1, 0.5]", *app_option)
    assert (job["queue"], job["max_attempts"]) == ("reports", 3)
    overridden = run_json("enqueue", "thumbnail", "--args", "[1]", "--queue", "x", *app_option)
    assert overridden["queue"] == "x"
    wrong = run("enqueue", "thumbnail", "--args", "[1, 2, 3]", *app_option, code=1)
    assert "arguments do not fit task 'thumbnail'" in one_line_error(wrong)
    unknown = run("enqueue", "nope", *app_option, code=2)
    assert "has no task 'nope'" in unknown.stderr
    with App(dsn) as app:
        assert [j.task for j in app.jobs()] == ["thumbnail", "render_report"]
