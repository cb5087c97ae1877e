"""The job page shows what a parked job waits for and the signals it was sent, and sends
one with a form (CSRF-checked, audited) on every store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from conveyor import App, Context
from conveyor.audit import entries
from conveyor.testing import drain
from conveyor.web import create_app

BASE = "http://127.0.0.1"


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(create_app(app), base_url=BASE) as test_client:
        yield test_client


def csrf_of(client: TestClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match, f"no form token on {path}"
    return match.group(1)


def test_the_job_page_shows_the_wait_and_sends_its_signal(app: App, client: TestClient) -> None:
    @app.task(queue="web-sig")
    def pay(ctx: Context) -> Any:
        return ctx.wait_for("paid", timeout=3600)

    job = pay.enqueue()
    assert drain(app, ["web-sig"]) == {"snoozed": 1}
    page = client.get(f"/jobs/{job.id}").text
    assert 'id="job-waiting"' in page and 'signal <span class="mono">paid</span>' in page
    assert 'id="job-signal-form"' in page and 'name="name" required value="paid"' in page
    token = csrf_of(client, f"/jobs/{job.id}")
    stale = client.post(
        f"/jobs/{job.id}/signal", data={"name": "paid", "payload": "1"}, follow_redirects=False
    )
    assert stale.status_code == 403 and app.durable is not None
    assert app.durable.signal_list(job.id) == []  # refused without its token
    bad = client.post(
        f"/jobs/{job.id}/signal",
        data={"csrf_token": token, "name": "paid", "payload": "{oops"},
        follow_redirects=False,
    )
    assert bad.status_code == 400 and "not JSON" in bad.text
    sent = client.post(
        f"/jobs/{job.id}/signal",
        data={"csrf_token": token, "name": "paid", "payload": '{"amount": 3}'},
        follow_redirects=False,
    )
    assert sent.headers["location"] == f"/jobs/{job.id}?notice=signal_woke"
    (entry,) = [e for e in entries(app) if e.action == "signal"]
    assert entry.source == "dashboard" and entry.target == f"job {job.id}"
    assert drain(app, ["web-sig"]) == {"succeeded": 1}
    assert app.get(job.id).result == {"amount": 3}
    after = client.get(f"/jobs/{job.id}").text
    assert 'id="job-signals"' in after and "signal-paid-1" in after
    assert 'id="job-signal-form"' not in after  # a finished job takes no signal
    ended = client.post(
        f"/jobs/{job.id}/signal",
        data={"csrf_token": token, "name": "paid", "payload": ""},
        follow_redirects=False,
    )
    assert ended.status_code == 409 and "has finished" in ended.text


def test_the_job_page_lists_the_children_a_job_spawned_and_waits_for(
    app: App, client: TestClient
) -> None:
    @app.task(queue="web-kids")
    def kid(n: int) -> int:
        return n

    @app.task(queue="web-sig")
    def parent(ctx: Context) -> Any:
        return ctx.wait([ctx.spawn(kid, 1), ctx.spawn(kid, 2)])

    job = parent.enqueue()
    assert drain(app, ["web-sig"]) == {"snoozed": 1}
    kids = [k.id for k in app.jobs(queue="web-kids", limit=10)]
    page = client.get(f"/jobs/{job.id}").text
    spawned = page.split('id="job-spawned"')[1].split("</p>")[0]
    assert sorted(int(i) for i in re.findall(r'href="/jobs/(\d+)"', spawned)) == sorted(kids)
    waiting = page.split('id="job-waiting"')[1].split("</p>")[0]
    assert "children" in waiting and "wait-1" in waiting
