"""Structured logs: one JSON object per line, and every record about a job carries its fields.

``conveyor worker --log-format json`` in a subprocess: every line of its log
parses as JSON, and the lines about a job carry ``job_id``, ``task``,
``queue`` and ``attempt``. In this process: the same fields on a rescue's
lines, and ``conveyor.logs.configure(json=True)`` for applications.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from conveyor import App
from conveyor.job import Job, JobState, utcnow
from conveyor.logs import JsonFormatter, configure, job_fields
from conveyor.store.dsn import DSN_ENV
from conveyor.store.postgres import listener as pg_listener
from conveyor.worker.maintenance import Maintenance

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


def test_a_json_worker_log_names_each_jobs_fields(dsn: str) -> None:
    with App(dsn) as app:
        app.migrate()
        greeted = app.enqueue("greet", ["ada"], queue="logged")
        crashed = app.enqueue("crash", queue="logged", max_attempts=2)
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "json_logs_app:app", "--burst",
         "--log-format", "json"],
        cwd=TESTS, env={**os.environ, DSN_ENV: dsn},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (greeting,) = [line for line in lines if line.get("job_id") == greeted.id]
    assert greeting["level"] == "INFO" and greeting["logger"] == "conveyor.worker"
    assert {k: greeting[k] for k in ("task", "queue", "attempt", "outcome")} == {
        "task": "greet",
        "queue": "logged",
        "attempt": 1,
        "outcome": "succeeded",
    }
    assert greeting["message"].startswith(f"job {greeted.id} greet succeeded, took ")
    assert greeting["duration_ms"] >= 0
    crashes = [line for line in lines if line.get("job_id") == crashed.id]
    assert [(c["attempt"], c["outcome"], c["level"]) for c in crashes] == [
        (1, "retried", "INFO"),
        (2, "failed", "WARNING"),
    ]
    assert all(c["task"] == "crash" and c["queue"] == "logged" for c in crashes)
    assert crashes[-1]["message"].endswith("(attempt 2/2): RuntimeError: disk on fire")
    # The error as fields, and the worker that ran each attempt.
    assert all(c["error.type"] == "RuntimeError" for c in crashes)
    assert all(c["error.message"] == "disk on fire" for c in crashes)
    (started,) = [line for line in lines if line["message"].startswith("worker ")][:1]
    worker_id = started["message"].split()[1]
    assert greeting["worker"] == worker_id and all(c["worker"] == worker_id for c in crashes)
    assert "error.type" not in greeting


def test_a_jobs_fields_carry_the_trace_it_was_enqueued_in() -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    now = utcnow()
    job = Job(
        id=7, queue="q", task="t", state=JobState.RUNNING, args_json="[]", kwargs_json="{}",
        priority=0, run_at=now, attempts=1, max_attempts=3, created_at=now,
        worker="host:1:abc",
        headers_json=json.dumps({"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}),
    )  # fmt: skip
    fields = job_fields(job)
    assert (fields["trace_id"], fields["worker"]) == (trace, "host:1:abc")
    job = dataclasses.replace(job, headers_json=json.dumps({"traceparent": "garbage"}))
    assert "trace_id" not in job_fields(job)


def test_a_logged_exception_gives_its_type_and_message() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("conveyor.test.errors")
    logger.addHandler(handler)
    try:
        try:
            raise KeyError("missing")
        except KeyError:
            logger.error("it broke", exc_info=True)
    finally:
        logger.removeHandler(handler)
    entry = json.loads(stream.getvalue())
    assert (entry["error.type"], entry["error.message"]) == ("KeyError", "'missing'")


def test_a_rescue_logs_each_rescued_job_with_its_fields(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    job = app.enqueue("lost", queue="q")
    (claimed,) = app.store.job_claim(["q"], 1, "a-dead-worker", timedelta(seconds=0.2))
    time.sleep(0.5)  # its lease runs out, on the store's clock
    caplog.set_level(logging.WARNING, logger="conveyor.maintenance")
    Maintenance(app.runtime, "maintainer", 1.0).run_once()
    (record,) = [r for r in caplog.records if getattr(r, "job_id", None) == job.id]
    assert record.getMessage() == (
        f"job {job.id} lost rescued: its worker was lost (attempt 1/3); queued again"
    )
    assert (record.task, record.queue, record.attempt, record.outcome) == (  # type: ignore[attr-defined]
        "lost",
        "q",
        claimed.attempts,
        "rescued",
    )


def test_configure_json_for_applications() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure("info", json=True, stream=stream)
        job = Job(7, "mail", "send", JobState.RUNNING, "[]", "{}", 0, utcnow(), 2, 3, utcnow())
        logging.getLogger("myapp").warning("slow job", extra=job_fields(job))
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert {k: entry[k] for k in ("level", "logger", "message")} == {
        "level": "WARNING",
        "logger": "myapp",
        "message": "slow job",
    }
    assert (entry["job_id"], entry["task"], entry["queue"], entry["attempt"]) == (
        7,
        "send",
        "mail",
        2,
    )
    assert isinstance(JsonFormatter(), logging.Formatter)
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        configure("loud")
