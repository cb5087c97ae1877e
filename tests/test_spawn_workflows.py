"""The workflow page and ``conveyor workflows show`` draw spawned children (ctx.spawn),
and their own children, as they draw ``after=`` edges, on every store."""

from __future__ import annotations

import json
import os
from typing import Any

from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, Context, Workflow
from conveyor.cli import cli
from conveyor.store.dsn import DSN_ENV
from conveyor.testing import drain
from conveyor.web import create_app


def test_spawned_grandchildren_are_drawn_with_their_edges(app: App, dsn: str) -> None:
    @app.task(queue="leaves")
    def leaf(n: int) -> int:
        return n

    @app.task(queue="mids")
    def mid(ctx: Context) -> Any:
        return sum(ctx.wait([ctx.spawn(leaf, 1), ctx.spawn(leaf, 2)]))

    @app.task(queue="tops")
    def top(ctx: Context) -> Any:
        return ctx.wait(ctx.spawn(mid))

    @app.task(queue="tops")
    def report() -> str:
        return "done"

    wf = Workflow("family")
    first = wf.add(top.step())
    wf.add(report.step(), after=[first])
    wf.enqueue()
    assert drain(app, ["tops"]) == {"snoozed": 1}
    assert drain(app, ["mids"]) == {"snoozed": 1}
    assert drain(app, ["leaves"]) == {"succeeded": 2}
    (top_job,) = app.jobs(queue="tops", task="top", limit=5)
    (mid_job,) = app.jobs(queue="mids", limit=5)
    leaves = sorted(j.id for j in app.jobs(queue="leaves", limit=5))

    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        html = client.get("/workflows/family").text
    assert html.count('<path class="edge edge-spawned"') == 3  # top->mid, mid->two leaves
    assert html.count('<path class="edge') == 4  # and the after= edge to report

    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    shown = CliRunner().invoke(
        cli, ["workflows", "show", "family", "--dsn", dsn, "--json"], env=env
    )
    assert shown.exit_code == 0, shown.output
    jobs = {j["id"]: j for j in json.loads(shown.output)["jobs"]}
    assert jobs[mid_job.id]["after"] == [top_job.id]
    assert [jobs[i]["after"] for i in leaves] == [[mid_job.id], [mid_job.id]]
    text = CliRunner().invoke(cli, ["workflows", "show", "family", "--dsn", dsn], env=env)
    assert text.exit_code == 0, text.output
    for job_id in [mid_job.id, *leaves]:
        assert str(job_id) in text.output
