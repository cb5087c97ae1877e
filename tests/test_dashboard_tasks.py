"""The tasks page on every store: per-task throughput, failures, wait and run-time
percentiles over the last hour, day and week, as server-rendered SVG charts and
a table, from the metrics the store folds."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from starlette.testclient import TestClient

from conveyor import App
from conveyor.job import NewJob, utcnow
from conveyor.store.records import Finish
from conveyor.web import create_app
from conveyor.web.task_metrics import latency

LEASE = timedelta(minutes=5)
ODD = "<b>x</b>&'\""


def run(app: App, queue: str, task: str, wait: float, ran: float, kind: str = "complete") -> None:
    """One job due a few minutes ago, started after ``wait`` s, ended after ``ran`` s."""
    due = utcnow() - timedelta(minutes=3)
    new = NewJob(queue=queue, task=task, args_json="[]", kwargs_json="{}", run_at=due)
    (job,) = app.store.job_insert_many([new], now=due)
    started = due + timedelta(seconds=wait)
    (claimed,) = app.store.job_claim([queue], 1, "w1", LEASE, now=started)
    assert claimed.id == job.id
    finish = Finish(claimed.id, claimed.lease_token or "", kind, result_json="null", error="e")  # type: ignore[arg-type]
    assert app.store.job_finish([finish], now=started + timedelta(seconds=ran)) == [job.id]


@pytest.fixture
def client(app: App) -> TestClient:
    for _ in range(9):
        run(app, "mail", "send", wait=0.2, ran=0.05)
    run(app, "mail", "send", wait=4.0, ran=2.0)
    run(app, "mail", "digest", wait=1.0, ran=1.0, kind="fail")
    run(app, ODD, ODD, wait=0.0, ran=0.01)
    return TestClient(create_app(app), base_url="http://127.0.0.1")


def row_of(page: str, task: str) -> list[str]:
    rows = re.findall(r"<tr>(.*?)</tr>", page, re.DOTALL)
    (row,) = [
        r for r in rows if 'data-label="task"><a href="/tasks?window=' in r and f">{task}</a>" in r
    ]
    return [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
    ]


def test_the_page_shows_each_task(client: TestClient) -> None:
    response = client.get("/tasks")
    assert response.status_code == 200, response.text
    page = response.text
    # queue, task, finished, per hour, failed, retried, wait p50/p95/p99, run p50/p95/p99
    send = row_of(page, "send")
    assert send[:3] == ["mail", "send", "10"] and send[4:6] == ["0", "0"]
    assert 8.0 <= float(send[3]) <= 10.0  # per hour, over the 60-70 min the table covers
    assert send[6] == latency(0.2) or send[6].endswith("ms")
    p50 = float(send[9].removesuffix(" ms")) / 1000
    assert 0.05 / 2**0.5 <= p50 <= 0.05 * 2**0.5  # within a bucket of the truth
    assert (
        send[11].endswith(" s")
        and 2.0 / 2**0.5 <= float(send[11].removesuffix(" s")) <= 2.0 * 2**0.5
    )
    digest = row_of(page, "digest")
    assert digest[2] == "1" and digest[4] == "1"
    # The charts: bars of finished jobs and failures, lines of percentiles.
    assert page.count('class="bar bar-succeeded"') >= 1 and 'class="bar bar-failed"' in page
    assert page.count('<polyline class="line line-p99"') >= 2  # wait and run
    assert "Tasks over the last hour" in page
    # A name is data: escaped in the page, found again by its link.
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page


@pytest.mark.parametrize("window", ["day", "week"])
def test_longer_windows_read_hour_rows(client: TestClient, window: str) -> None:
    page = client.get(f"/tasks?window={window}").text
    assert f"Tasks over the last {window}" in page
    assert row_of(page, "send")[2] == "10"
    assert "one point per hour" in page


def test_a_selection_narrows_the_charts(client: TestClient) -> None:
    page = client.get("/tasks?queue=mail&task=digest").text
    assert "mail · digest" in page
    bars = re.findall(r'class="bar bar-(\w+)"[^>]*><title>([^<]*)</title>', page)
    assert {state for state, _ in bars} <= {"failed"} and bars  # digest failed, no send
    assert row_of(page, "send")[2] == "10"  # the table keeps every task


def test_bad_window(client: TestClient) -> None:
    response = client.get("/tasks?window=year")
    assert response.status_code == 400
    assert "window must be one of hour, day, week" in response.text


def test_the_nav_links_the_page(client: TestClient) -> None:
    assert (
        '<a href="http://127.0.0.1/tasks">Tasks</a>' in client.get("/").text
        or 'href="/tasks"' in client.get("/").text
    )
