"""A workflow retried from its failures, on every store: the failed jobs and the jobs
their failure cancelled run again; the succeeded ones keep their results."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor import App, Context, Workflow
from conveyor.errors import JobNotFoundError, JobStateError
from conveyor.testing import drain


def build(app: App) -> dict[str, Any]:
    """a, e, f succeed; b fails; c (after a, b) and d (after c) are cancelled by it;
    f runs after b anyway; g was cancelled by an operator on its own."""
    broken = {"on": True}
    runs: dict[str, int] = {}

    @app.task()
    def value(name: str, x: int) -> int:
        runs[name] = runs.get(name, 0) + 1
        return x

    @app.task(max_attempts=1)
    def flaky(name: str, x: int) -> int:
        runs[name] = runs.get(name, 0) + 1
        if broken["on"]:
            raise RuntimeError("partner down")
        return x

    @app.task()
    def total(ctx: Context, name: str) -> int:
        runs[name] = runs.get(name, 0) + 1
        return sum(v for v in ctx.upstream.values() if isinstance(v, int))

    wf = Workflow("nightly")
    a = wf.add(value.step("a", 1))
    b = wf.add(flaky.step("b", 2))
    c = wf.add(total.step("c"), after=[a, b])
    d = wf.add(total.step("d"), after=c)
    e = wf.add(value.step("e", 5), after=a)
    f = wf.add(total.step("f"), after=b, after_failure="run")
    g = wf.add(value.options(delay=3600).step("g", 7))
    run = wf.enqueue()
    nodes = (a, b, c, d, e, f, g)
    jobs = {name: run.jobs[node.position] for name, node in zip("abcdefg", nodes, strict=True)}
    app.cancel(jobs["g"].id)
    drain(app)
    return {"run": run, "jobs": jobs, "broken": broken, "runs": runs}


def states(app: App, jobs: dict[str, Any]) -> dict[str, str]:
    return {name: str(app.get(job.id).state) for name, job in jobs.items()}


def test_the_failed_and_what_they_cancelled_run_again(app: App) -> None:
    built = build(app)
    jobs, runs = built["jobs"], built["runs"]
    assert states(app, jobs) == {
        "a": "succeeded", "b": "failed", "c": "cancelled", "d": "cancelled",
        "e": "succeeded", "f": "succeeded", "g": "cancelled",
    }  # fmt: skip
    assert app.stats().count("failed") == 1
    built["broken"]["on"] = False

    assert app.retry_workflow("nightly") == 3
    assert states(app, jobs) == {
        "a": "succeeded", "b": "queued", "c": "waiting", "d": "waiting",
        "e": "succeeded", "f": "succeeded", "g": "cancelled",
    }  # fmt: skip
    b = app.get(jobs["b"].id)
    assert (b.attempts, b.error, b.finished_at) == (0, None, None)
    assert app.get(jobs["c"].id).error is None
    assert [e.kind for e in app.events(jobs["c"].id)][-1] == "manual_retry"
    assert app.stats().count("failed") == 0 and app.stats().count("waiting") == 2

    drain(app)
    assert set(states(app, jobs).values()) == {"succeeded", "cancelled"}
    assert states(app, jobs)["g"] == "cancelled"  # an operator's cancel is not undone
    assert app.get(jobs["c"].id).result == 1 + 2  # a's kept result and b's new one
    assert app.get(jobs["d"].id).result == 3
    # The succeeded ones kept their results and did not run again.
    assert runs == {"a": 1, "b": 2, "c": 1, "d": 1, "e": 1, "f": 1}
    assert app.workflow_status("nightly").counts == {"succeeded": 6, "cancelled": 1}
    assert app.retry_workflow("nightly") == 0  # nothing failed: nothing changes


def test_a_retry_refused_for_a_taken_key_changes_nothing(app: App) -> None:
    @app.task(max_attempts=1)
    def once(x: int) -> None:
        raise RuntimeError("no")

    @app.task()
    def after(ctx: Context) -> None:
        return None

    wf = Workflow("keyed")
    first = wf.add(once.options(key="invoice-7").step(1))
    wf.add(after.step(), after=first)
    run = wf.enqueue()
    drain(app)
    assert [str(j.state) for j in app.workflow("keyed").jobs] == ["failed", "cancelled"]
    holder = once.options(key="invoice-7", delay=3600).enqueue(2)  # the key is live again
    assert holder.id != run.jobs[0].id
    with pytest.raises(JobStateError, match=r"'keyed' was not retried: .* key"):
        app.retry_workflow("keyed")
    assert [str(j.state) for j in app.workflow("keyed").jobs] == ["failed", "cancelled"]
    app.cancel(holder.id)
    assert asyncio.run(app.aretry_workflow("keyed")) == 2
    assert run.status().counts == {"queued": 1, "waiting": 1}


def test_retry_from_the_run_and_of_an_unknown_workflow(app: App) -> None:
    built = build(app)
    built["broken"]["on"] = False
    assert built["run"].retry() == 3
    with pytest.raises(JobNotFoundError, match="no workflow with id 'nope'"):
        app.retry_workflow("nope")


def test_retry_on_the_command_line_and_the_dashboard(app: App, dsn: str) -> None:
    import re

    from click.testing import CliRunner
    from starlette.testclient import TestClient

    from conveyor.cli import cli
    from conveyor.web import create_app

    built = build(app)
    built["broken"]["on"] = False
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get("/workflows/nightly").text
        assert "Retry from its failures" in page
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        refused = client.post("/workflows/nightly/retry", data={}, follow_redirects=False)
        assert refused.status_code == 403 and app.workflow_status("nightly").counts["failed"] == 1
        done = client.post(
            "/workflows/nightly/retry",
            data={"csrf_token": token.group(1)},
            follow_redirects=False,
        )
        assert done.status_code == 303
        assert done.headers["location"] == "/workflows/nightly?notice=workflow_retried&n=3"
        shown = client.get(done.headers["location"]).text
        assert "Jobs of the workflow put back to run again: 3." in shown
        assert "Retry from its failures" not in shown  # nothing failed now

    runner = CliRunner()
    quiet = runner.invoke(cli, ["workflows", "retry", "nightly", "--dsn", dsn])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stdout.strip() == "workflow nightly has no failed job: nothing to run again"
    built["broken"]["on"] = True
    drain(app)
    assert app.workflow_status("nightly").counts["failed"] == 1
    again = runner.invoke(cli, ["workflows", "retry", "nightly", "--dsn", dsn])
    assert again.stdout.strip() == "3 jobs of workflow nightly put back to run again"
    unknown = runner.invoke(cli, ["workflows", "retry", "nope", "--dsn", dsn])
    assert unknown.exit_code != 0 and "no workflow with id 'nope'" in unknown.output


def test_a_job_that_ran_anyway_and_failed_waits_for_its_rerun_parent(app: App) -> None:
    broken = {"on": True}

    @app.task(max_attempts=1)
    def step(ctx: Context, name: str) -> str:
        if broken["on"]:
            raise RuntimeError(f"{name} failed")
        return name + "".join(str(v) for v in ctx.upstream.values())

    wf = Workflow("anyway")
    first = wf.add(step.step("a"))
    second = wf.add(step.step("b"), after=first, after_failure="run")
    third = wf.add(step.step("c"), after=second)
    run = wf.enqueue()
    drain(app)
    ids = [run.jobs[n.position].id for n in (first, second, third)]
    assert [str(app.get(i).state) for i in ids] == ["failed", "failed", "cancelled"]
    broken["on"] = False
    assert app.retry_workflow("anyway") == 3
    assert [str(app.get(i).state) for i in ids] == ["queued", "waiting", "waiting"]
    drain(app)
    assert [app.get(i).result for i in ids] == ["a", "ba", "cba"]
