"""``conveyor jobs signal``: an operator sends a job its signal from the command line,
the action audited; refusals are one clear line."""

from __future__ import annotations

import json
import os
from typing import Any

from click.testing import CliRunner, Result

from conveyor import App, Context
from conveyor.audit import entries
from conveyor.cli import cli
from conveyor.signals import signals
from conveyor.store.dsn import DSN_ENV
from conveyor.testing import drain


def run(*args: str, code: int = 0) -> Result:
    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def test_an_operator_signals_a_parked_job_from_the_command_line(app: App, dsn: str) -> None:
    @app.task(queue="cli-sig")
    def pay(ctx: Context) -> Any:
        return ctx.wait_for("paid", timeout=3600)

    job = pay.enqueue()
    assert drain(app, ["cli-sig"]) == {"snoozed": 1}
    said = run("--dsn", dsn, "jobs", "signal", str(job.id), "paid", "--payload", '{"amount": 5}')
    assert "due now" in said.stdout
    assert drain(app, ["cli-sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == {"amount": 5}
    (entry,) = [e for e in entries(app) if e.action == "signal"]
    assert entry.target == f"job {job.id}: paid" and entry.source == "cli"


def test_refusals_say_which(app: App, dsn: str) -> None:
    missing = run("--dsn", dsn, "jobs", "signal", "424242", "paid", code=1)
    assert "no job with id 424242" in missing.stderr
    bad = run("--dsn", dsn, "jobs", "signal", "1", "paid", "--payload", "{nope", code=2)
    assert "is not valid JSON" in bad.stderr

    @app.task(queue="cli-sig")
    def done() -> None:
        return None

    job = done.enqueue()
    assert drain(app, ["cli-sig"]) == {"succeeded": 1}
    ended = run("--dsn", dsn, "jobs", "signal", str(job.id), "paid", code=1)
    assert f"job {job.id} has finished (succeeded)" in ended.stderr
    assert signals(app.store, job.id) == []


def test_jobs_show_says_what_a_parked_job_waits_for(app: App, dsn: str) -> None:
    @app.task(queue="cli-sig")
    def pay(ctx: Context) -> Any:
        return ctx.wait_for("paid", timeout=3600)

    job = pay.enqueue()
    assert drain(app, ["cli-sig"]) == {"snoozed": 1}
    shown = json.loads(run("--dsn", dsn, "jobs", "show", str(job.id), "--json").stdout)
    assert shown["waiting"]["signal"] == "paid" and shown["waiting"]["step"] == "signal-paid-1"
    assert shown["waiting"]["until"][:16] == app.get(job.id).run_at.isoformat()[:16]
    text = " ".join(run("--dsn", dsn, "jobs", "show", str(job.id)).stdout.split())
    assert "waiting: for signal 'paid' (step signal-paid-1), until" in text
    app.signal(job.id, "paid", 1)
    drain(app, ["cli-sig"])
    done = json.loads(run("--dsn", dsn, "jobs", "show", str(job.id), "--json").stdout)
    assert done["waiting"] is None


def test_jobs_show_lists_the_children_a_job_spawned(app: App, dsn: str) -> None:
    @app.task(queue="cli-kids")
    def kid() -> int:
        return 1

    @app.task(queue="cli-sig")
    def parent(ctx: Context) -> Any:
        return ctx.wait([ctx.spawn(kid)])

    job = parent.enqueue()
    assert drain(app, ["cli-sig"]) == {"snoozed": 1}
    (child,) = app.jobs(queue="cli-kids", limit=10)
    shown = json.loads(run("--dsn", dsn, "jobs", "show", str(job.id), "--json").stdout)
    assert shown["spawned"] == [child.id] and shown["waiting"]["children"] == [child.id]
    text = " ".join(run("--dsn", dsn, "jobs", "show", str(job.id)).stdout.split())
    assert f"spawned: {child.id}" in text and f"for children {child.id}" in text
