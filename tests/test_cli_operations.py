"""The command line as an operator uses it: states, bulk and group actions, purges
with a count first, refusals that name what is wrong, tables that fit 80 columns.

In-process through click's CliRunner, except where the process is the point
(Ctrl-C on --watch, the worker's log format).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from conveyor import App, JobState
from conveyor.cli import cli
from conveyor.errors import JobNotFoundError
from conveyor.job import Job, utcnow
from conveyor.store.dsn import DSN_ENV
from outcomes import Failure

TESTS = Path(__file__).parent


def run(*args: str, code: int = 0, stdin: str | None = None, columns: int | None = None) -> Result:
    # The command may set $CONVEYOR_DSN (``conveyor --dsn X ...``): restored afterwards.
    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    result = CliRunner().invoke(cli, list(args), input=stdin, env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def one_line_error(result: Result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def fail_for_good(app: App, queue: str, n: int, error: str = "ValueError: nope") -> list[int]:
    ids = [app.enqueue("t", [i], queue=queue, max_attempts=1).id for i in range(n)]
    now = utcnow()
    for job in app.store.job_claim([queue], n, "w", timedelta(seconds=30), now):
        app.store.job_finish([Failure(job.id, job.lease_token or "", error, now)], now)
    return ids


def retrying(app: App, queue: str) -> Job:
    job = app.enqueue("charge", [1], queue=queue, max_attempts=3)
    now = utcnow()
    (held,) = app.store.job_claim([queue], 1, "w", timedelta(seconds=30), now)
    later = now + timedelta(hours=1)
    error = "Traceback (most recent call last):\n  ...\nTimeoutError: partner slow"
    app.store.job_finish([Failure(held.id, held.lease_token or "", error, later)], now)
    return app.get(job.id)


# --- no silent empty databases ---------------------------------------------------------------


def test_reading_commands_refuse_a_sqlite_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    dsn = f"sqlite:///{missing}"
    for args in (
        ["stats"],
        ["jobs", "list"],
        ["jobs", "show", "1"],
        ["jobs", "cancel", "1"],
        ["jobs", "retry", "--all-failed", "--yes"],
        ["purge", "--older-than", "7d"],
        ["pause", "mail"],
    ):
        error = one_line_error(run(*args, "--dsn", dsn, code=1))
        assert f"no database at {missing}" in error, args
    assert not missing.exists()
    empty = one_line_error(run("stats", "--dsn", "", code=1))
    assert "the DSN is empty" in empty
    assert "the DSN given with --dsn is empty" in one_line_error(run("--dsn", "", "stats", code=1))


def test_an_unmigrated_postgres_says_run_conveyor_migrate(
    pg_clean_dsn: str, tmp_path: Path
) -> None:
    for args in (["stats"], ["jobs", "list"], ["enqueue", "t"], ["pause", "q"]):
        error = one_line_error(run(*args, "--dsn", pg_clean_dsn, code=1))
        assert "has no conveyor tables: run `conveyor migrate`" in error, args
    worker = subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "worker_app:app", "--burst"],
        cwd=TESTS,
        env={**os.environ, DSN_ENV: pg_clean_dsn},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 1
    assert "run `conveyor migrate`" in worker.stderr and "Traceback" not in worker.stderr
    run("migrate", "--dsn", pg_clean_dsn)
    assert run("stats", "--dsn", pg_clean_dsn).stdout.startswith("Queues")


# --- global options, anywhere -------------------------------------------------------------------


def test_dsn_and_debug_before_or_after_the_command(app: App, dsn: str) -> None:
    app.enqueue("t", [], queue="here")
    assert "here" in run("--dsn", dsn, "stats", "--json").stdout
    assert "here" in run("stats", "--json", "--dsn", dsn).stdout
    assert "here" in run("--dsn", dsn, "jobs", "list", "--json").stdout
    # After the command it wins over the one before it.
    assert "here" in run("--dsn", "sqlite:///elsewhere.db", "stats", "--json", "--dsn", dsn).stdout
    after = run("jobs", "show", "999999", "--dsn", dsn, "--debug", code=1)
    # --debug after the command: the exception itself comes out, not the one-line summary.
    assert isinstance(after.exception, JobNotFoundError) and "error:" not in after.stderr
    assert run("jobs", "show", "999999", "--dsn", dsn, code=1).stderr.startswith("error: no job")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Each wait below is for an event, bounded for a machine at several times its cores'
# load (a fresh interpreter can take a minute to import there): the whole test
# may take that long, and pytest's default limit would cut it short.
@pytest.mark.timeout(400)
def test_ctrl_c_on_watch_exits_quietly(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'w.db'}"
    with App(dsn) as app:
        app.enqueue("t", [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "stats", "--watch", "--interval", "0.2", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As a terminal starts it: a pytest-xdist worker ignores SIGINT, and an ignored
        # signal stays ignored across exec (Python then installs no Ctrl-C handler).
        preexec_fn=_sigint_default,
    )
    out: list[str] = []
    shown = threading.Event()

    def read_snapshots() -> None:
        # Until the end of its output: Ctrl-C is sent once two snapshots are out,
        # not after a fixed time (a loaded machine can take seconds to import).
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "".join(out).count("Queues") >= 2:
                shown.set()
        shown.set()

    reader = threading.Thread(target=read_snapshots, daemon=True)
    reader.start()
    try:
        assert shown.wait(120), "no two snapshots within 120 s"
        assert proc.poll() is None, "the watch ended by itself"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        reader.join(timeout=60)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        reader.join(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == 0, err
    assert err == "" and "Aborted" not in "".join(out)
    assert "".join(out).count("Queues") >= 2


def test_pause_of_an_unknown_queue_warns(app: App, dsn: str) -> None:
    app.enqueue("t", [], queue="mail")
    result = run("pause", "mial", "--dsn", dsn)
    assert "warning: no queue named 'mial' has jobs or settings yet (known: mail)" in result.stderr
    assert result.stdout.strip() == "queue mial paused"
    assert run("pause", "mail", "--dsn", dsn).stderr == ""


# --- states, tables ------------------------------------------------------------------------------


def test_tables_fit_80_columns_with_the_zone_named(app: App, dsn: str) -> None:
    long_queue = "images-for-the-public-website-in-several-sizes"
    for n in range(3):
        app.enqueue("thumbnails.make_every_size_of_a_picture", [n], queue=long_queue)
    app.enqueue("send", [1], queue="mail", delay=3600)
    retried = retrying(app, "billing")
    app.store.worker_register("host-a:4242:0a1b2c3d", "host-a", 4242, ["billing"], 8, utcnow())

    listing = run("jobs", "list", "--dsn", dsn, columns=80).stdout.splitlines()
    assert all(len(line) <= 80 for line in listing), listing
    assert "(UTC)" in listing[0]
    # A block per job: its first line has the id, state and "queue · task"; the
    # error's message follows, wrapped. No name is cut.
    rows = listing[2:-1]  # the last line counts the matches
    by_id = {line.split()[0]: n for n, line in enumerate(rows, 2) if line[:4].strip()}
    first = by_id[str(retried.id)]
    assert "retrying" in listing[first] and "billing · charge" in listing[first]
    assert "TimeoutError: partner slow" in listing[first + 1]
    assert long_queue in "".join("".join(listing).split())
    assert "…" not in "".join(listing)
    stats = run("stats", "--dsn", dsn, columns=80).stdout.splitlines()
    assert all(len(line) <= 80 for line in stats), stats
    assert any("retry 1" in line for line in stats) and any("sched 1" in line for line in stats)
    wide = run("stats", "--dsn", dsn, columns=160).stdout
    assert "scheduled" in wide and "retrying" in wide and "host-a:4242:0a1b2c3d" in wide
    shown = run("jobs", "show", str(retried.id), "--dsn", dsn, columns=80).stdout
    # Written as the dashboard and the worker's log write durations (rounded to the second).
    assert "retrying (queued, due in 59 min 5" in shown or "due in 1 h)" in shown
    assert f"next run          {retried.run_at:%Y-%m-%d %H:%M:%S} UTC" in shown
    assert all(len(line) <= 80 for line in shown.splitlines() if not line.startswith(" "))


def test_list_and_count_by_state_and_group(app: App, dsn: str) -> None:
    retried = retrying(app, "billing")
    later = app.enqueue("t", [], queue="mail", delay=600).id
    group = [app.enqueue("reply", [n], queue="chat", group="s-42").id for n in range(3)]
    ids = [
        j["id"]
        for j in json.loads(
            run("jobs", "list", "--state", "retrying", "--json", "--dsn", dsn).stdout
        )
    ]
    assert ids == [retried.id]
    listed = json.loads(run("jobs", "list", "--state", "scheduled", "--json", "--dsn", dsn).stdout)
    assert [j["id"] for j in listed] == [later] and listed[0]["detailed_state"] == "scheduled"
    grouped = json.loads(run("jobs", "list", "--group", "s-42", "--json", "--dsn", dsn).stdout)
    assert [j["id"] for j in grouped] == group[::-1]
    counts = json.loads(run("jobs", "count", "--group", "s-42", "--json", "--dsn", dsn).stdout)
    assert counts["ready"] == 3 and counts["running"] == 0
    table = run("jobs", "count", "--dsn", dsn).stdout
    assert "retrying" in table and "total" in table and "5" in table


# --- acting in bulk ---------------------------------------------------------------


def test_bulk_actions_count_first_then_ask(app: App, dsn: str) -> None:
    failed = fail_for_good(app, "mail", 3, "TimeoutError: relay slow")
    other = fail_for_good(app, "mail", 1, "ValueError: refused")
    # A dry run counts and changes nothing.
    dry = run("jobs", "retry", "--state", "failed", "--error", "timeout", "--dry-run", "--dsn", dsn)
    assert dry.stdout.strip() == "3 job(s) match (failed 3); 3 can be queued again"
    assert app.count_jobs(state="failed") == {"failed": 4}
    # Not confirmed: nothing changes, and it says so.
    declined = run("jobs", "retry", "--error", "timeout", "--dsn", dsn, stdin="n\n", code=1)
    assert "retry 3 job(s)? [y/N]" in declined.stderr
    assert "not confirmed: nothing changed" in declined.stderr
    assert app.count_jobs(state="failed") == {"failed": 4}
    done = run("jobs", "retry", "--error", "timeout", "--dsn", dsn, stdin="y\n")
    assert done.stdout.endswith("3 job(s) queued again\n")
    assert sorted(j.id for j in app.jobs(state="ready")) == failed
    # By ids: no question, the state of each is checked.
    ids = run("jobs", "delete", str(failed[0]), str(other[0]), "--dsn", dsn)
    assert ids.stdout.splitlines()[-1] == "2 job(s) deleted"
    assert app.store.job_get(other[0]) is None


def test_one_job_actions_say_why_they_do_nothing(app: App, dsn: str) -> None:
    later = app.enqueue("t", [], queue="q", delay=3600).id
    assert run("jobs", "run-now", str(later), "--dsn", dsn).stdout.strip() == (
        f"job {later} made due now"
    )
    refused = run("jobs", "run-now", str(later), "--dsn", dsn, code=1)
    assert f"job {later} is ready; run-now applies to scheduled or retrying jobs" in one_line_error(
        refused
    )
    assert "is not a job id" in run("jobs", "show", str(2**64), "--dsn", dsn, code=2).stderr


def test_group_cancel_and_take_back(app: App, dsn: str) -> None:
    ids = [app.enqueue("reply", [n], queue="chat", group="s-42").id for n in range(3)]
    (held,) = app.store.job_claim(["chat"], 1, "consumer-a", timedelta(seconds=30), utcnow())
    out = run("jobs", "cancel", "--group", "s-42", "--state", "queued", "--yes", "--dsn", dsn)
    assert out.stdout.splitlines() == [
        "2 job(s) match (ready 2); 2 can be cancelled or asked to stop",
        "2 job(s) cancelled or asked to stop",
    ]
    assert app.get(held.id).state == JobState.RUNNING
    back = run("jobs", "take-back", "--group", "s-42", "--yes", "--dsn", dsn)
    assert back.stdout.splitlines()[-1] == "1 job(s) taken back"
    assert app.get(held.id).state == JobState.QUEUED
    assert [app.get(i).state for i in ids[1:]] == [JobState.CANCELLED] * 2


def test_purge_by_state_and_queue_with_dry_run_and_confirmation(app: App, dsn: str) -> None:
    fail_for_good(app, "mail", 2)
    fail_for_good(app, "sms", 1)
    app.enqueue("t", [], queue="mail")
    dry = run(
        "purge",
        "--older-than",
        "0s",
        "--state",
        "failed",
        "--queue",
        "mail",
        "--dry-run",
        "--dsn",
        dsn,
    )
    assert dry.stdout.strip() == "would purge 2 failed job(s) of any age in queue mail"
    declined = run("purge", "--older-than", "0s", "--dsn", dsn, stdin="n\n", code=1)
    assert "not confirmed" in declined.stderr
    assert app.count_jobs(state="failed") == {"failed": 3}
    out = run(
        "purge",
        "--older-than",
        "0s",
        "--state",
        "failed",
        "--queue",
        "mail",
        "--dsn",
        dsn,
        stdin="y\n",
    )
    assert out.stdout.strip().endswith("purged 2 failed job(s) of any age in queue mail")
    assert app.count_jobs() == {"ready": 1, "failed": 1}


def test_delete_a_queue(app: App, dsn: str) -> None:
    fail_for_good(app, "old", 2)
    app.enqueue("t", [], queue="old")
    app.pause("old")
    out = run("delete-queue", "old", "--yes", "--dsn", dsn).stdout
    assert out.splitlines() == [
        "queue old holds 3 job(s) (ready 1, failed 2)",
        "queue old deleted with 3 job(s)",
    ]
    assert "old" not in app.store.queue_names()
    assert "no queue named 'old'" in one_line_error(
        run("delete-queue", "old", "--dsn", dsn, code=1)
    )


# --- the worker's log, as the command line configures it ------------------------------------


def _worker(tmp_path: Path, *args: str) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "logging_app:app", "--burst", *args],
        cwd=TESTS,
        env={**os.environ, DSN_ENV: f"sqlite:///{tmp_path / 'logs.db'}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_worker_logs_json_lines_through_the_logging_module(tmp_path: Path) -> None:
    result = _worker(tmp_path, "--log-format", "json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    mine = [entry for entry in lines if entry["logger"] == "conveyor.testapp"]
    assert len(mine) == 1
    entry = mine[0]
    assert entry["level"] == "INFO" and entry["message"] == "tasks loaded"
    assert entry["tasks"] == 1 and entry["where"] == "import"
    assert entry["time"].endswith("+00:00")
    text = _worker(tmp_path, "--log-level", "warning")
    assert text.returncode == 0 and "tasks loaded" not in text.stderr
    plain = _worker(tmp_path)
    assert " INFO conveyor.testapp: tasks loaded" in plain.stderr
    bad = _worker(tmp_path, "--log-format", "xml")
    assert bad.returncode == 2 and "'xml' is not one of 'text', 'json'" in bad.stderr
