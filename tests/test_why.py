"""app.why: each thing that holds a job back, named, on every store where it applies."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import pytest

from conveyor import App
from conveyor.diagnosis import Why
from conveyor.job import utcnow

LEASE = timedelta(seconds=30)


def kinds(why: Why) -> list[str]:
    return [reason.kind for reason in why.reasons]


def serve(app: App, *queues: str, seen_ago: float = 0.0) -> None:
    """A worker registered on ``queues``, last seen ``seen_ago`` seconds ago."""
    at = utcnow() - timedelta(seconds=seen_ago)
    name = f"w-{'-'.join(queues)}-{seen_ago:g}"
    app.store.worker_register(name, socket.gethostname(), os.getpid(), list(queues), 4, at)


@pytest.fixture
def tasks(app: App) -> App:
    @app.task(queue="api")
    def call(n: int = 0) -> None:
        return None

    return app


def test_a_ready_job_with_a_live_worker_has_no_reason(tasks: App) -> None:
    serve(tasks, "api")
    job = tasks.enqueue("call")
    why = tasks.why(job.id)
    assert why.reasons == () and why.waiting
    assert why.summary().startswith("nothing holds it back")


def test_no_live_worker_serving_the_queue(tasks: App) -> None:
    job = tasks.enqueue("call")
    assert kinds(tasks.why(job.id)) == ["no_worker"]
    assert "no live worker" in tasks.why(job.id).reasons[0].text
    serve(tasks, "other")
    serve(tasks, "api", seen_ago=120)  # silent for two minutes: not live
    reason = tasks.why(job.id).reasons[0]
    assert reason.kind == "no_worker"
    assert "serves queue 'api'" in reason.text and "1 live on other queues" in reason.text


def test_paused_queue(tasks: App) -> None:
    serve(tasks, "api")
    job = tasks.enqueue("call")
    tasks.pause("api")
    why = tasks.why(job.id)
    assert kinds(why) == ["paused"]
    assert why.reasons[0].text == "queue 'api' is paused"
    tasks.resume("api")
    assert kinds(tasks.why(job.id)) == []


def test_not_due_until_run_at(tasks: App) -> None:
    serve(tasks, "api")
    job = tasks.get_task("call").options(delay=600).enqueue()
    reason = tasks.why(job.id).reasons[0]
    assert reason.kind == "not_due"
    assert reason.until == job.run_at
    assert "(in 10 min)" in reason.text


def test_held(tasks: App) -> None:
    serve(tasks, "api")
    job = tasks.enqueue("call")
    tasks.hold(job.id)
    assert kinds(tasks.why(job.id)) == ["held"]
    tasks.unhold(job.id)
    assert kinds(tasks.why(job.id)) == []


def test_group_running_job_named(tasks: App) -> None:
    serve(tasks, "api")
    first = tasks.enqueue("call", group="g1")
    second = tasks.enqueue("call", group="g1")
    claimed = tasks.store.job_claim(["api"], 1, "w1", LEASE)
    assert [j.id for j in claimed] == [first.id]
    reason = tasks.why(second.id).reasons[0]
    assert reason.kind == "group_busy" and reason.job_ids == (first.id,)
    assert f"job {first.id} of its group 'g1' is running" in reason.text
    assert kinds(tasks.why(first.id)) == [] and not tasks.why(first.id).waiting


def test_queue_concurrency_and_rate_limits(tasks: App) -> None:
    serve(tasks, "api")
    tasks.limit("api", concurrency=1)
    first, second = tasks.enqueue("call"), tasks.enqueue("call")
    assert len(tasks.store.job_claim(["api"], 5, "w1", LEASE)) == 1
    reason = tasks.why(second.id).reasons[0]
    assert reason.kind == "concurrency"
    assert reason.text == "queue 'api' is at its concurrency limit: 1 running; limit 1"
    tasks.limit("api", None, concurrency=None)
    tasks.limit("api", "1/h")
    third = tasks.enqueue("call")
    assert len(tasks.store.job_claim(["api"], 5, "w1", LEASE)) == 1
    assert first.id != third.id
    reason = tasks.why(third.id).reasons[0]
    assert reason.kind == "rate"
    assert "rate limit (1/h): 1 started in the last hour" in reason.text


def test_queue_throttle_until(tasks: App) -> None:
    serve(tasks, "api")
    job = tasks.enqueue("call")
    until = tasks.throttle("api", 300)
    reason = tasks.why(job.id).reasons[0]
    assert reason.kind == "throttled" and reason.until == until
    assert "queue 'api' is throttled until" in reason.text


def test_limit_key_throttle_concurrency_and_rate(tasks: App) -> None:
    serve(tasks, "api")
    bound = tasks.get_task("call").options(limit_key="c-1 'x'")
    first, second = bound.enqueue(), bound.enqueue()
    other = tasks.get_task("call").options(limit_key="c2").enqueue()
    until = tasks.throttle("api", 300, limit_key="c-1 'x'")
    reason = tasks.why(first.id).reasons[0]
    assert reason.kind == "key_throttled" and reason.limit_key == "c-1 'x'"
    assert reason.until == until
    assert kinds(tasks.why(other.id)) == []

    tasks.throttle("api", 0, limit_key="c-1 'x'")
    tasks.limit("api", concurrency=1, per_key=True)
    claimed = {j.id for j in tasks.store.job_claim(["api"], 5, "w1", LEASE)}
    assert claimed == {first.id, other.id}
    reason = tasks.why(second.id).reasons[0]
    assert reason.kind == "key_concurrency"
    assert "limit key \"c-1 'x'\" of queue 'api'" in reason.text and "1 running" in reason.text

    tasks.limit("api", None, concurrency=None, per_key=True)
    tasks.limit("api", "1/h", per_key=True)
    third = tasks.get_task("call").options(limit_key="c3").enqueue()
    fourth = tasks.get_task("call").options(limit_key="c3").enqueue()
    claimed = {j.id for j in tasks.store.job_claim(["api"], 5, "w1", LEASE)}
    assert third.id in claimed and fourth.id not in claimed
    reason = tasks.why(fourth.id).reasons[0]
    assert reason.kind == "key_rate" and "1 started in the last hour" in reason.text


def test_waiting_for_parents(tasks: App) -> None:
    serve(tasks, "api")
    parent = tasks.enqueue("call")
    child = tasks.enqueue("call", after=[parent])
    reason = tasks.why(child.id).reasons[0]
    assert reason.kind == "waiting_for_parents" and reason.job_ids == (parent.id,)
    assert reason.text == f"waiting for job to end: {parent.id}"


def test_two_reasons_at_once_and_the_async_twin(tasks: App) -> None:
    import asyncio

    job = tasks.enqueue("call")
    tasks.pause("api")
    why = asyncio.run(tasks.awhy(job.id))
    assert kinds(why) == ["paused", "no_worker"]
    assert why.summary() == "; ".join(r.text for r in why.reasons)


def test_jobs_show_says_why_in_text_and_json(tasks: App, dsn: str) -> None:
    import json

    from click.testing import CliRunner

    from conveyor.cli import cli

    job = tasks.enqueue("call", group="g 1")
    blocker = tasks.enqueue("call", group="g 1")
    tasks.store.job_claim(["api"], 1, "w1", LEASE)  # the first of the group runs
    assert tasks.get(job.id).state == "running"
    tasks.pause("api")
    runner = CliRunner()
    shown = runner.invoke(cli, ["jobs", "show", str(blocker.id), "--dsn", dsn])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "why it is not running:" in text
    assert "- queue 'api' is paused" in text
    assert f"- job {job.id} of its group 'g 1' is running" in text
    assert "- no live worker" in text
    raw = runner.invoke(cli, ["jobs", "show", str(blocker.id), "--dsn", dsn, "--json"])
    why = json.loads(raw.stdout)["why"]
    assert [r["kind"] for r in why["reasons"]] == ["paused", "group_busy", "no_worker"]
    assert why["reasons"][1]["job_ids"] == [job.id]
    running = runner.invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn, "--json"])
    assert json.loads(running.stdout)["why"] is None
    assert (
        "why it is not running"
        not in runner.invoke(cli, ["jobs", "show", str(job.id), "--dsn", dsn]).stdout
    )


def test_the_new_reads_say_the_schema_is_missing(tmp_path: Any) -> None:
    """A store's mixins are behind its error boundary too: a missing table is named."""
    import sqlite3

    from conveyor.errors import SchemaMissingError
    from conveyor.store.dsn import open_store

    path = tmp_path / "jobs.db"
    store = open_store(f"sqlite:///{path}")
    store.migrate()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE limit_throttles")
        conn.execute("DROP TABLE job_flows")
    try:
        with pytest.raises(SchemaMissingError, match="run `conveyor migrate`"):
            store.limit_throttled_keys(utcnow(), 10)  # type: ignore[attr-defined]
        with pytest.raises(SchemaMissingError, match="run `conveyor migrate`"):
            store.workflow_retry("w", utcnow())  # type: ignore[attr-defined]
    finally:
        store.close()
