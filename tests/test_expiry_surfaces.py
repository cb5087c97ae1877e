"""Where an expired job shows, on every store: listings filtered by its error,
``conveyor jobs show``, ``conveyor stats``, /metrics and the job page."""

from __future__ import annotations

import json
from datetime import timedelta

from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.expiry import EXPIRED_ERROR
from conveyor.job import Job, JobState, utcnow
from conveyor.store.expiring import ExpiringStore
from conveyor.web import create_app
from conveyor.web.metrics import Metrics


def expired_and_waiting(app: App) -> tuple[Job, Job]:
    """One job of queue q that expired, and one whose deadline is an hour away."""

    @app.task(queue="q")
    def work() -> None: ...

    gone = work.options(expires=1).enqueue()
    pending = work.options(expires=3600).enqueue()
    assert isinstance(app.store, ExpiringStore)
    assert app.store.job_expire(utcnow() + timedelta(seconds=5)) == [gone.id]
    return gone, pending


def cli_json(dsn: str, *args: str) -> object:
    result = CliRunner().invoke(cli, [*args, "--dsn", dsn, "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_a_listing_finds_expired_jobs_by_their_error(app: App) -> None:
    gone, pending = expired_and_waiting(app)
    found = app.jobs(state="cancelled", error="expired")
    assert [j.id for j in found] == [gone.id]
    assert found[0].error == EXPIRED_ERROR and pending.id not in {j.id for j in found}
    assert isinstance(app.store, ExpiringStore)
    assert app.store.job_expired_counts() == {"q": 1}


def test_metrics_count_expired_jobs_per_queue(app: App) -> None:
    expired_and_waiting(app)
    text = Metrics(app).render()
    assert 'conveyor_jobs_expired{queue="q"} 1' in text
    app.retry_jobs([j.id for j in app.jobs(state="cancelled")])  # no longer expired
    assert 'conveyor_jobs_expired{queue="q"} 0' in Metrics(app).render()


def test_cli_shows_the_deadline_and_the_expiry(app: App, dsn: str) -> None:
    gone, pending = expired_and_waiting(app)
    shown = cli_json(dsn, "jobs", "show", str(gone.id))
    assert isinstance(shown, dict)
    assert shown["expired"] is True and shown["state"] == "cancelled"
    assert shown["expires_at"] is not None
    waiting = cli_json(dsn, "jobs", "show", str(pending.id))
    assert isinstance(waiting, dict) and waiting["expired"] is False
    assert waiting["expires_at"] is not None
    text = CliRunner().invoke(cli, ["jobs", "show", str(gone.id), "--dsn", dsn]).stdout
    assert "expires" in text and "expired: never started" in text
    stats = cli_json(dsn, "stats")
    assert isinstance(stats, dict) and stats["expired"] == {"q": 1}


def test_the_job_page_shows_the_deadline_and_the_expiry(app: App) -> None:
    gone, pending = expired_and_waiting(app)
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{gone.id}").text
        assert 'id="job-expires"' in page and "expired: never started" in page
        assert "<h2>Expired</h2>" in page
        other = client.get(f"/jobs/{pending.id}").text
        assert 'id="job-expires"' in other and "expired: never started" not in other
    assert app.get(pending.id).state is JobState.QUEUED
