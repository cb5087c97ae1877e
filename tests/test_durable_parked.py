"""Parked jobs are seen and operable on every store: stats, ``conveyor stats``, the
dashboard's overview and /metrics count them per queue; ``jobs show``, the job page
and ``job.waiting()`` say what each waits for (a sleep too); an operator wakes one
early from the CLI or the dashboard."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from conveyor import App, Context, JobNotFoundError, JobState, JobStateError, SignalTimeout
from conveyor.audit import entries
from conveyor.cli import cli
from conveyor.signals import waiting, wake
from conveyor.store.dsn import DSN_ENV
from conveyor.testing import drain
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def run(*args: str, code: int = 0) -> Result:
    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(create_app(app), base_url=BASE) as test_client:
        yield test_client


def durable_tasks(app: App, calls: list[Any]) -> None:
    @app.task(queue="park")
    def nap(ctx: Context) -> str:
        calls.append("before")
        ctx.sleep(3600)
        calls.append("after")
        return "rested"

    @app.task(queue="park")
    def approve(ctx: Context) -> Any:
        try:
            return ctx.wait_for("ok", timeout=3600)
        except SignalTimeout:
            calls.append("timed out")
            return "no answer"

    @app.task(queue="park-kids")
    def kid() -> int:
        return 1

    @app.task(queue="park")
    def parent(ctx: Context) -> list[Any]:
        return ctx.wait([ctx.spawn(kid)])


def test_parked_jobs_are_counted_per_queue_until_woken(app: App) -> None:
    calls: list[Any] = []
    durable_tasks(app, calls)
    nap = app.get_task("nap").enqueue()
    approve = app.get_task("approve").enqueue()
    app.get_task("parent").enqueue()
    scheduled = app.get_task("kid").options(delay=3600).enqueue()
    assert drain(app, ["park"]) == {"snoozed": 3}
    stats = app.stats()
    assert stats.queues["park"].parked == 3
    assert stats.queues["park-kids"].parked == 0  # the scheduled kid is not parked
    assert stats.queues["park-kids"].scheduled == 1 and scheduled.id
    assert app.signal(approve.id, "ok", "yes") is True
    assert app.stats().queues["park"].parked == 2  # due now: no longer parked
    wake(app.durable, nap.id, app.get)
    assert app.stats().queues["park"].parked == 1
    assert drain(app, ["park"]) == {"succeeded": 2}
    assert calls == ["before", "before", "after"]  # woken early: the sleep is over
    assert app.get(nap.id).result == "rested" and app.get(approve.id).result == "yes"
    assert waiting(app.store, nap.id) is None  # its wait ended with the sleep


def test_a_sleeping_job_says_until_when_and_a_wake_ends_a_signal_wait(app: App) -> None:
    calls: list[Any] = []
    durable_tasks(app, calls)
    nap = app.get_task("nap").enqueue()
    approve = app.get_task("approve").enqueue()
    assert drain(app, ["park"]) == {"snoozed": 2}
    slept = app.get(nap.id).waiting()
    assert slept is not None and slept.step == "sleep-1"
    assert slept.signal is None and slept.children is None
    assert slept.until > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=50)
    # A replay before its time (as after a crash, or run now) sleeps on to the same time.
    app.run_jobs_now([nap.id])
    assert drain(app, ["park"]) == {"snoozed": 1}
    assert calls == ["before", "before"]
    again = waiting(app.store, nap.id)
    assert again is not None and again.until == slept.until
    # Woken early, a wait for a signal times out in the handler.
    wake(app.durable, approve.id, app.get)
    assert app.get(approve.id).detailed_state() == "ready"
    assert drain(app, ["park"]) == {"succeeded": 1}
    assert app.get(approve.id).result == "no answer" and "timed out" in calls


def test_wake_refuses_jobs_no_wait_parks(app: App) -> None:
    @app.task(queue="park")
    def plain() -> None:
        return None

    job = plain.enqueue()
    with pytest.raises(JobStateError, match=f"job {job.id} is ready, not parked"):
        wake(app.durable, job.id, app.get)
    with pytest.raises(JobNotFoundError, match="no job with id 424242"):
        wake(app.durable, 424242, app.get)
    assert drain(app, ["park"]) == {"succeeded": 1}
    with pytest.raises(JobStateError, match="is succeeded, not parked"):
        wake(app.durable, job.id, app.get)


def test_stats_and_show_on_the_command_line_and_wake(app: App, dsn: str) -> None:
    calls: list[Any] = []
    durable_tasks(app, calls)
    nap = app.get_task("nap").enqueue()
    assert drain(app, ["park"]) == {"snoozed": 1}
    stats = json.loads(run("--dsn", dsn, "stats", "--json").stdout)
    assert stats["queues"]["park"]["parked"] == 1
    table = run("--dsn", dsn, "stats").stdout
    assert "parked" in table
    shown = run("--dsn", dsn, "jobs", "show", str(nap.id)).stdout
    assert "sleeps (step sleep-1), until" in shown
    as_json = json.loads(run("--dsn", dsn, "jobs", "show", str(nap.id), "--json").stdout)
    assert as_json["waiting"]["kind"] == "sleep" and as_json["waiting"]["step"] == "sleep-1"
    assert "woken: due now" in run("--dsn", dsn, "jobs", "wake", str(nap.id)).stdout
    refused = run("--dsn", dsn, "jobs", "wake", str(nap.id), code=1)
    assert "not parked" in refused.stderr
    (entry,) = [e for e in entries(app) if e.action == "wake"]
    assert entry.target == f"job {nap.id}" and entry.source == "cli"
    assert drain(app, ["park"]) == {"succeeded": 1}
    assert app.get(nap.id).state == JobState.SUCCEEDED


def test_the_dashboard_counts_shows_and_wakes_a_parked_job(app: App, client: TestClient) -> None:
    calls: list[Any] = []
    durable_tasks(app, calls)
    nap = app.get_task("nap").enqueue()
    assert drain(app, ["park"]) == {"snoozed": 1}
    overview = client.get("/").text
    assert re.search(r'data-label="parked">1<', overview), overview
    metrics = client.get("/metrics").text
    assert 'conveyor_jobs_parked{queue="park"} 1' in metrics
    page = client.get(f"/jobs/{nap.id}").text
    assert "Parked: sleeps" in page and "sleep-1" in page
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match and f'action="/jobs/{nap.id}/wake"' in page
    woken = client.post(
        f"/jobs/{nap.id}/wake", data={"csrf_token": match.group(1)}, follow_redirects=False
    )
    assert woken.headers["location"] == f"/jobs/{nap.id}?notice=run_now"
    assert app.get(nap.id).detailed_state() == "ready"
    assert 'conveyor_jobs_parked{queue="park"} 0' in client.get("/metrics").text
    refused = client.post(
        f"/jobs/{nap.id}/wake", data={"csrf_token": match.group(1)}, follow_redirects=False
    )
    assert refused.status_code == 409 and "not parked" in refused.text
