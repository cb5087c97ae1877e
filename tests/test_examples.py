"""Every program in examples/ runs as a user runs it, and does what its docstring says.

Each runs in a subprocess of its own (``python examples/<name>.py``) against a
fresh SQLite file named by ``CONVEYOR_DSN``, from a temporary working
directory; the test reads its output and then the store it left behind.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor import App
from conveyor.signals import signals
from waiting import wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, tmp_path: Path, timeout: float = 60, **env: str) -> tuple[str, str]:
    """Run examples/<name>.py to its end; return its dsn and its standard output."""
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        cwd=tmp_path,
        env={**os.environ, "CONVEYOR_DSN": dsn, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{name}.py exited {result.returncode}:\n{result.stderr}"
    return dsn, result.stdout


def test_every_example_has_a_test() -> None:
    tested = {
        name.removeprefix("test_").split("_runs")[0]
        for name in globals()
        if name.startswith("test_") and "_runs" in name
    }
    assert {path.stem for path in EXAMPLES.glob("*.py")} == tested


def test_first_job_runs(tmp_path: Path) -> None:
    dsn, out = run_example("first_job", tmp_path)
    assert "result: Hello, Ada!" in out
    assert "keyed result: Hello, Grace!" in out
    assert "keyed enqueue twice: job 2 and job 2 (existing: True)" in out
    assert "history: enqueued, claimed, succeeded" in out
    with App(dsn) as app:
        assert [job.state for job in app.jobs(limit=10)] == ["succeeded", "succeeded"]


def test_first_jobs_worker_line_opens_the_same_database(tmp_path: Path) -> None:
    """The docstring's worker line, run where the example ran, serves the example's jobs."""
    (line,) = [
        text.strip()
        for text in (EXAMPLES / "first_job.py").read_text().splitlines()
        if "conveyor worker first_job:app" in text
    ]
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_DSN"}
    with App(f"sqlite:///{tmp_path / 'conveyor.db'}") as app:  # the example's default
        app.migrate()
        job = app.enqueue("greet", ["Lin"], queue="greetings")
    assert line.startswith("PYTHONPATH=examples conveyor worker ")
    command = line.removeprefix("PYTHONPATH=examples conveyor ").split()
    (tmp_path / "examples").symlink_to(EXAMPLES)
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", *command, "--burst"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": "examples"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    with App(f"sqlite:///{tmp_path / 'conveyor.db'}") as app:
        assert app.get(job.id).result == "Hello, Lin!"


def test_effects_psycopg_pool_says_at_once_that_it_needs_postgresql(tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "effects_psycopg_pool.py")],
        cwd=tmp_path,
        env={**os.environ, "CONVEYOR_DSN": f"sqlite:///{tmp_path / 'jobs.db'}"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "needs PostgreSQL: set CONVEYOR_DSN=postgresql://" in result.stderr
    assert "(it is sqlite:...)" in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 10
    assert not (tmp_path / "jobs.db").exists()


def test_retries_runs(tmp_path: Path) -> None:
    dsn, out = run_example("retries", tmp_path)
    assert "flaky charge: charged 1250 cents to card-0001" in out
    assert "history: enqueued, claimed, retried, claimed, retried, claimed, succeeded" in out
    assert "history: enqueued, claimed, snoozed, claimed, succeeded" in out
    assert "charge failed: conveyor.errors.Fail: card-0002 declined" in out
    assert "refund failed: ValueError: order 17 has no payment to refund" in out
    assert "retried by hand: charged 990 cents to card-0002" in out
    with App(dsn) as app:
        by_task = {(job.task, job.args[0]): job for job in app.jobs(limit=10)}
    assert by_task[("charge", "card-0001")].attempts == 3
    assert by_task[("charge", "card-0002")].state == "succeeded"
    refund = by_task[("refund", 17)]
    assert (refund.state, refund.attempts) == ("failed", 2)
    assert "ValueError" in (refund.error or "")
    assert by_task[("ship", 42)].attempts == 1  # a Retry uses no attempt


def test_durable_reminder_runs(tmp_path: Path) -> None:
    dsn, out = run_example("durable_reminder", tmp_path)
    assert "job 1: reminder sent to ann@example.com" in out
    assert "bo@example.com answered: no reminder" in out
    # Each mail once, though each handler ran twice (before and after its sleep).
    assert out.count("welcome -> ann@example.com") == 1
    assert "steps welcome, sleep-1, reminder; attempts 1" in out
    assert "steps welcome, sleep-1; attempts 1" in out
    with App(dsn) as app:
        jobs = app.jobs(limit=10)
    assert sorted(job.state for job in jobs) == ["succeeded", "succeeded"]
    for job in jobs:
        assert job.started_at is not None and job.started_at - job.created_at >= timedelta(
            seconds=1
        )


def test_ordered_group_runs(tmp_path: Path) -> None:
    dsn, out = run_example("ordered_group", tmp_path)
    for account in ("acct-a", "acct-b", "acct-c"):
        assert f"{account}: entries applied in order [1, 2, 3, 4, 5]" in out
    assert "(acct-b, attempts 2)" in out
    with App(dsn) as app:
        jobs = sorted(app.jobs(limit=100), key=lambda job: job.id)
        assert len(jobs) == 15 and all(job.state == "succeeded" for job in jobs)
        # Within a group, each job was first claimed after the one before it
        # succeeded: the history's seqs are in commit order.
        for group in ("acct-a", "acct-b", "acct-c"):
            mine = [job for job in jobs if job.group == group]
            for before, after in itertools.pairwise(mine):
                ended = [e.seq for e in app.events(before.id) if e.kind == "succeeded"]
                claims = [e.seq for e in app.events(after.id) if e.kind == "claimed"]
                assert min(claims) > max(ended), (before.id, after.id)


def test_partner_limits_runs(tmp_path: Path) -> None:
    dsn, out = run_example("partner_limits", tmp_path)
    assert "20 calls in" in out

    def figure(label: str) -> int:
        found = re.search(rf"{label}: (\d+)", out)
        assert found is not None, (label, out)
        return int(found.group(1))

    assert figure("most calls at once") <= 2
    assert figure("most calls in one second") <= 10
    assert figure("most calls of one customer in one second") <= 5
    assert "answered 429: 1 time(s), for cust-3" in out
    assert "attempts used per job: at most 1" in out  # the throttled job used no attempt
    with App(dsn) as app:
        assert app.count_jobs(queue="partner") == {"succeeded": 20}
        assert app.limits() == {}  # the example cleared its limits


def test_periodic_runs(tmp_path: Path) -> None:
    dsn, out = run_example("periodic", tmp_path)
    ran = re.search(r"tick ran (\d+) times", out)
    assert ran is not None and int(ran.group(1)) >= 2, out
    with App(dsn) as app:
        ticks = app.jobs(task="tick", limit=100)
        keys = [job.key for job in ticks]
        assert len(keys) == len(set(keys))  # one job per tick
        assert all(key and key.startswith("periodic:tick:") for key in keys)
        nightly = app.jobs(task="nightly_report", limit=10)
    assert len(nightly) == 1 and nightly[0].key is not None
    assert nightly[0].key.endswith("T03:00:00+00:00")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _call(method: str, url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


def test_fastapi_app_runs(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "fastapi_app.py")],
        cwd=tmp_path,
        env={**os.environ, "CONVEYOR_DSN": dsn, "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(lambda: _answers(f"{base}/openapi.json"), 30, "the app answers")
        status, body = _call("POST", f"{base}/reports/2024")
        assert status == 200
        assert body["state"] == "succeeded" and body["result"] == {"year": 2024, "pages": 25}

        status, body = _call("POST", f"{base}/reports/2200?wait=0.2")
        assert status == 202 and body["state"] == "running"
        slow = body["job"]

        status, body = _call("GET", f"{base}/jobs/{slow}")
        assert status == 200 and body["state"] == "running"
        status, body = _call("GET", f"{base}/jobs/{slow + 100}")
        assert status == 404 and "no job with id" in body["detail"]

        started = time.monotonic()
        server.send_signal(signal.SIGINT)  # the lifespan drains the worker: the slow job ends
        output, _ = server.communicate(timeout=30)
        assert server.returncode == 0, output
        assert time.monotonic() - started < 20
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    with App(dsn) as app:
        assert app.get(slow).state == "succeeded"
        assert app.get(slow).result == {"year": 2200, "pages": 1}


@pytest.mark.slow
@pytest.mark.timeout(420)  # the example's own limit governs, not the suite's 120 s
def test_spark_pipeline_runs(tmp_path: Path) -> None:
    # As the suite's Spark fixture: Spark's Python workers must be this
    # interpreter (the one with conveyor installed), on loopback.
    env = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    dsn, out = run_example("spark_pipeline", tmp_path, timeout=360, **env)
    assert "write: 200 rows, 200 jobs enqueued, 0 skipped" in out
    assert "the same write again: new=False" in out
    assert "jobs succeeded: 200" in out
    assert "job 1: images/1-256px.png" in out
    with App(dsn) as app:
        assert app.count_jobs(batch="thumbnails") == {"succeeded": 200}


def test_effects_psycopg_pool_runs(tmp_path: Path, pg_clean_dsn: str) -> None:
    _, out = run_example("effects_psycopg_pool", tmp_path, CONVEYOR_DSN=pg_clean_dsn)
    assert "result: {'order': 7, 'auth': 'auth-7-1250'}" in out
    # The step ran once, on the first attempt; the second got its result back.
    assert "provider calls: authorize 7\n" in out
    assert "steps: authorize (attempt 1)" in out
    assert "history: enqueued, claimed, retried, claimed, succeeded" in out
    assert "payments: [(7, 'auth-7-1250')]" in out
    with App(pg_clean_dsn) as app:
        (job,) = app.jobs(limit=10)
        assert (job.state, job.attempts) == ("succeeded", 2)


def example_dsn(request: pytest.FixtureRequest, database: str, tmp_path: Path) -> str:
    """The DSN an example of both SQL databases runs on (as run_example names SQLite's)."""
    if database == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    pg_dsn: str = request.getfixturevalue("pg_clean_dsn")
    return pg_dsn


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_effects_sqlalchemy_runs(
    tmp_path: Path, request: pytest.FixtureRequest, database: str
) -> None:
    dsn = example_dsn(request, database, tmp_path)
    _, out = run_example("effects_sqlalchemy", tmp_path, CONVEYOR_DSN=dsn)
    assert "result: invoice for order 1\nresult: invoice for order 2\n" in out
    assert "history: enqueued, claimed, succeeded" in out
    assert "invoices: [(1, 'Ada'), (2, 'Grace')]" in out
    with App(dsn) as app:
        assert sorted(str(job.result) for job in app.jobs(limit=10)) == [
            "invoice for order 1",
            "invoice for order 2",
        ]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_effects_django_runs(tmp_path: Path, request: pytest.FixtureRequest, database: str) -> None:
    dsn = example_dsn(request, database, tmp_path)
    _, out = run_example("effects_django", tmp_path, CONVEYOR_DSN=dsn)
    assert "result: welcomed ada\nresult: welcomed grace\n" in out
    assert "history: enqueued, claimed, succeeded" in out
    assert "welcomed: ['ada', 'grace']" in out
    with App(dsn) as app:
        assert {job.state for job in app.jobs(limit=10)} == {"succeeded"}


# The durable execution guide's examples (docs/durable.md).
def test_reminder_with_timeout_runs(tmp_path: Path) -> None:
    dsn, out = run_example("reminder_with_timeout", tmp_path)
    assert "job 1: reminder sent to ann@example.com" in out
    assert "job 2: bo@example.com answered 'thanks!': no reminder" in out
    assert out.count("welcome -> ann@example.com") == 1  # once, though the handler ran twice
    assert "job 1: steps welcome, signal-answer-1, reminder" in out
    with App(dsn) as app:
        assert [s.payload for s in signals(app.store, 2)] == ["thanks!"]
        assert "timeout" in app.steps(1)[1].result


def test_payment_callback_runs(tmp_path: Path) -> None:
    dsn, out = run_example("payment_callback", tmp_path)
    assert "job 1: order A1 shipped (charge ch_A1_1200)" in out
    assert "job 2: order B2: payment declined, not shipped" in out
    with App(dsn) as app:
        for job_id in (1, 2):
            (taken,) = signals(app.store, job_id)
            assert taken.step == "signal-payment-1" and taken.received_at is not None


def test_fan_out_merge_runs(tmp_path: Path) -> None:
    dsn, out = run_example("fan_out_merge", tmp_path)
    assert "job 1: 9 words" in out
    assert "job 1: steps spawn-1, spawn-2, spawn-3, wait-1" in out
    assert "children: {'succeeded': 3}" in out
    with App(dsn) as app:
        kids = app.jobs(queue="pages", limit=10)
    assert sorted(k.key or "" for k in kids) == [f"spawn:1:{n}" for n in (1, 2, 3)]
