"""Workflows as an operator sees them: the dashboard's pages, the command line, /metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, Context, Workflow
from conveyor.cli import cli
from conveyor.testing import drain
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def build(app: App) -> dict[str, Any]:
    @app.task()
    def fetch(n: int) -> int:
        return n

    @app.task(max_attempts=1)
    def merge(ctx: Context) -> int:
        if len(ctx.upstream) > 2:
            raise RuntimeError("too many")
        return sum(ctx.upstream.values())

    wf = Workflow("nightly-1", name="nightly")
    a, b, c = wf.group(fetch.step(1), fetch.step(2), fetch.step(3))
    ok = wf.add(merge.step(), after=[a, b])
    bad = wf.add(merge.step(), after=[a, b, c])
    wf.add(merge.step(), after=[bad])
    wf.add(merge.step(), after=[ok])
    run = wf.enqueue()
    drain(app)
    # A second workflow left waiting: its first job is held back by a delay.
    later = Workflow("later")
    first = later.add(fetch.options(delay=3600).step(1))
    later.add(merge.step(), after=[first])
    waiting = later.enqueue()
    return {"run": run, "waiting": waiting}


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(create_app(app), base_url=BASE) as test_client:
        yield test_client


def test_the_workflow_page_draws_the_graph_in_state_colours(app: App, client: TestClient) -> None:
    built = build(app)
    jobs = built["run"].jobs
    html = client.get("/workflows/nightly-1").text
    assert html.count('class="node-succeeded"') == 5
    assert html.count('class="node-failed"') == 1 and html.count('class="node-cancelled"') == 1
    assert html.count('<path class="edge') == 2 + 3 + 1 + 1
    assert f'first failure: <a href="/jobs/{jobs[4].id}">' in html
    assert '/workflows">Workflows</a>' in html  # in the navigation
    listing = client.get("/workflows").text
    assert 'href="/workflows/nightly-1">nightly-1</a>' in listing
    assert 'href="/workflows/later">later</a>' in listing
    assert client.get("/workflows/no-such").status_code == 404


def test_the_job_page_shows_parents_children_and_the_workflow(app: App, client: TestClient) -> None:
    jobs = build(app)["run"].jobs
    html = client.get(f"/jobs/{jobs[3].id}").text
    parents = html.split('id="job-parents"')[1].split("</ul>")[0]
    assert f'href="/jobs/{jobs[0].id}"' in parents and f'href="/jobs/{jobs[1].id}"' in parents
    assert "state-succeeded" in parents
    children = html.split('id="job-children"')[1].split("</ul>")[0]
    assert f'href="/jobs/{jobs[6].id}"' in children
    assert 'href="/workflows/nightly-1"' in html


def test_a_workflow_is_cancelled_from_its_page(app: App, client: TestClient) -> None:
    waiting = build(app)["waiting"]
    page = client.get("/workflows/later").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token and "Cancel workflow" in page
    response = client.post(
        "/workflows/later/cancel", data={"csrf_token": token.group(1)}, follow_redirects=False
    )
    assert response.status_code == 303
    assert app.workflow_status(waiting.id).counts == {"cancelled": 2}


def test_metrics_count_waiting_jobs(app: App, client: TestClient) -> None:
    build(app)
    text = client.get("/metrics").text
    assert 'conveyor_jobs{queue="default",state="waiting"} 1' in text


def test_the_command_line_lists_and_shows_workflows(app: App, dsn: str) -> None:
    jobs = build(app)["run"].jobs
    runner = CliRunner()
    listing = runner.invoke(cli, ["workflows", "list", "--dsn", dsn, "--json"])
    assert listing.exit_code == 0, listing.output
    rows = {row["id"]: row for row in json.loads(listing.output)}
    assert rows["nightly-1"]["counts"] == {"cancelled": 1, "failed": 1, "succeeded": 5}
    assert rows["later"]["counts"] == {"queued": 1, "waiting": 1}

    shown = runner.invoke(cli, ["workflows", "show", "nightly-1", "--dsn", dsn])
    assert shown.exit_code == 0, shown.output
    assert "first failed job: " + str(jobs[4].id) in shown.output
    assert f"job {jobs[4].id}, which this job waits for, failed" in shown.output
    as_json = json.loads(
        runner.invoke(cli, ["workflows", "show", "nightly-1", "--dsn", dsn, "--json"]).output
    )
    assert as_json["jobs"][3]["after"] == [jobs[0].id, jobs[1].id]

    job = runner.invoke(cli, ["jobs", "show", str(jobs[3].id), "--dsn", dsn, "--json"])
    assert json.loads(job.output)["children"] == [jobs[6].id]

    unknown = runner.invoke(cli, ["workflows", "show", "nope", "--dsn", dsn])
    assert unknown.exit_code != 0 and "no workflow with id 'nope'" in unknown.output

    cancelled = runner.invoke(cli, ["workflows", "cancel", "later", "--dsn", dsn])
    assert cancelled.exit_code == 0 and "2 jobs of workflow later" in cancelled.output
