"""Children: ctx.spawn enqueues a child once (a replay finds the same child), ctx.wait
parks the parent until its children have ended, then returns their results or raises
ChildFailed; cancelling the parent cancels its waiting children; on every store."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, ChildFailed, Context, Fail, JobState, Workflow
from conveyor.cli import cli
from conveyor.context import SPAWNED_BY
from conveyor.signals import spawned, waiting
from conveyor.testing import drain
from conveyor.web import create_app


def fan_out(app: App, calls: list[Any]) -> None:
    @app.task(queue="kids")
    def page(n: int) -> int:
        if n < 0:
            raise Fail(f"page {n} is bad")
        return n * 10

    @app.task(queue="parents")
    def merge(ctx: Context, pages: list[int]) -> Any:
        children = [ctx.spawn(page, n) for n in pages]
        calls.append(list(children))
        try:
            return sum(ctx.wait(children))
        except ChildFailed as exc:
            return {"failed": sorted(exc.errors), "results": exc.results}


def test_a_parent_waits_for_its_children_and_merges_their_results(app: App) -> None:
    calls: list[Any] = []
    fan_out(app, calls)
    parent = app.get_task("merge").enqueue([1, 2, 3])
    assert drain(app, ["parents"]) == {"snoozed": 1}
    wait = waiting(app.store, parent.id)
    assert wait is not None and wait.step == "wait-1" and wait.children == calls[0]
    kids = [app.get(i) for i in calls[0]]
    assert [k.headers for k in kids] == [{SPAWNED_BY: str(parent.id)}] * 3
    assert [k.key for k in kids] == [f"spawn:{parent.id}:{n}" for n in (1, 2, 3)]
    # Woken early (the children still queued): parks again, enqueues no child again.
    app.run_jobs_now([parent.id])
    assert drain(app, ["parents"]) == {"snoozed": 1}
    assert calls[1] == calls[0] and app.count_jobs(queue="kids") == {"ready": 3}
    assert drain(app, ["kids"]) == {"succeeded": 3}
    assert drain(app, ["parents"], with_scheduled=True) == {"succeeded": 1}
    assert app.get(parent.id).result == 60
    assert waiting(app.store, parent.id) is None  # it waits no more
    assert spawned(app.steps(parent.id)) == calls[0]
    assert [s.name for s in app.steps(parent.id)] == ["spawn-1", "spawn-2", "spawn-3", "wait-1"]


def test_a_worker_resumes_the_parent_soon_after_its_children_end(app: App) -> None:
    calls: list[Any] = []
    fan_out(app, calls)
    parent = app.get_task("merge").enqueue([4, 5])
    with app.worker(queues=["parents", "kids"], concurrency=4, poll_interval=0.1):
        assert app.wait(parent.id, timeout=15) == 90
    assert app.count_jobs(queue="kids") == {"succeeded": 2}


def test_failed_children_raise_child_failed_with_the_others_results(app: App) -> None:
    calls: list[Any] = []
    fan_out(app, calls)
    parent = app.get_task("merge").enqueue([1, -1])
    drain(app, ["parents"])
    drain(app, ["kids"])
    assert drain(app, ["parents"], with_scheduled=True) == {"succeeded": 1}
    good, bad = calls[0]
    assert app.get(parent.id).result == {"failed": [bad], "results": {str(good): 10}}


def test_cancelling_the_parent_cancels_its_waiting_children(app: App) -> None:
    calls: list[Any] = []
    fan_out(app, calls)
    parent = app.get_task("merge").enqueue([1, 2])
    assert drain(app, ["parents"]) == {"snoozed": 1}
    assert app.cancel(parent.id).state == JobState.CANCELLED
    assert [app.get(i).state for i in calls[0]] == [JobState.CANCELLED] * 2


def test_a_parent_whose_children_ended_already_does_not_park(app: App) -> None:
    @app.task(queue="kids")
    def kid() -> str:
        return "k"

    @app.task(queue="parents")
    def slow_parent(ctx: Context) -> Any:
        child = ctx.spawn(kid, key="the-one")
        if ctx.attempt == 1:
            raise RuntimeError("crash after the spawn")
        return ctx.wait(child)

    parent = slow_parent.enqueue()
    assert drain(app, ["parents"]) == {"retried": 1}
    assert drain(app, ["kids"]) == {"succeeded": 1}
    time.sleep(1.1)  # the retry's backoff
    assert drain(app, ["parents"], with_scheduled=True) == {"succeeded": 1}
    assert app.get(parent.id).result == ["k"]
    assert app.count_jobs(queue="kids") == {"succeeded": 1}


@pytest.mark.parametrize("bad", [object(), "x"])
def test_waiting_for_something_that_is_not_a_job_fails_clearly(app: App, bad: Any) -> None:
    @app.task(queue="parents", max_attempts=1)
    def odd(ctx: Context) -> Any:
        return ctx.wait([bad])

    job = odd.enqueue()
    assert drain(app, ["parents"]) == {"failed": 1}
    assert "ctx.wait: give child job ids (from ctx.spawn) or jobs, got" in (
        app.get(job.id).error or ""
    )


def test_spawning_something_that_is_not_a_task_fails_clearly(app: App) -> None:
    @app.task(queue="parents", max_attempts=1)
    def odd(ctx: Context) -> Any:
        return ctx.spawn("count_words", 1)

    job = odd.enqueue()
    assert drain(app, ["parents"]) == {"failed": 1}
    assert "ctx.spawn: give a task" in (app.get(job.id).error or "")
    assert app.steps(job.id) == []


def test_the_workflow_views_draw_spawned_children(app: App, dsn: str) -> None:
    @app.task(queue="kids")
    def leaf(n: int) -> int:
        return n

    @app.task(queue="parents")
    def fan(ctx: Context) -> int:
        return sum(ctx.wait([ctx.spawn(leaf, 1), ctx.spawn(leaf, 2)]))

    wf = Workflow("fanning")
    wf.add(fan.step())
    (parent,) = wf.enqueue().jobs
    drain(app, ["parents"])
    drain(app, ["kids"])
    assert drain(app, ["parents"], with_scheduled=True) == {"succeeded": 1}
    kids = sorted(k.id for k in app.jobs(queue="kids", limit=10))
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        html = client.get("/workflows/fanning").text
    assert html.count('<path class="edge edge-spawned"') == 2
    assert html.count('class="node-succeeded"') == 3
    shown = CliRunner().invoke(cli, ["workflows", "show", "fanning", "--dsn", dsn, "--json"])
    assert shown.exit_code == 0, shown.output
    jobs = {j["id"]: j for j in json.loads(shown.output)["jobs"]}
    assert [jobs[k]["after"] for k in kids] == [[parent.id], [parent.id]]
