"""Declared workflows: a graph built first, enqueued at once, followed and cancelled."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from conveyor import App, Context, InvalidJobError, JobState, Workflow, chain, chord, group
from conveyor.store.records import Finish
from conveyor.testing import drain


def tasks(app: App) -> dict[str, Any]:
    @app.task()
    def value(x: int) -> int:
        return x

    @app.task()
    def add(ctx: Context, extra: int = 0) -> int:
        return sum(ctx.upstream.values()) + extra

    @app.task(max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    return {"value": value, "add": add, "boom": boom}


def test_a_declared_graph_runs_and_reports_its_status(app: App) -> None:
    t = tasks(app)
    wf = Workflow("report-1", name="report")
    a = wf.add(t["value"].step(1))
    b, c = wf.group(t["add"].step(extra=10), t["add"].step(extra=20), after=[a])
    d = wf.add(t["add"].step(), after=[b, c])

    run = wf.enqueue()

    assert not run.existing and run.id == "report-1" and run.name == "report"
    assert [j.state for j in run.jobs] == ["queued", "waiting", "waiting", "waiting"]
    assert run.status().counts == {"queued": 1, "waiting": 3}
    assert d.position == 3
    assert drain(app) == {"succeeded": 4}
    status = run.wait(timeout=5)
    assert status.finished and status.succeeded and status.failed_job is None
    assert app.get(run.jobs[3].id).result == 11 + 21
    assert [w.id for w in app.workflows()] == ["report-1"]
    assert {(e[0], e[1]) for e in app.store.workflow_edges("report-1")} == {
        (run.jobs[1].id, run.jobs[0].id),
        (run.jobs[2].id, run.jobs[0].id),
        (run.jobs[3].id, run.jobs[1].id),
        (run.jobs[3].id, run.jobs[2].id),
    }


def test_a_second_enqueue_with_the_same_id_returns_the_stored_workflow(app: App) -> None:
    t = tasks(app)
    first = chain(t["value"].step(1), t["add"].step(), id="nightly").enqueue()
    again = chain(t["value"].step(2), t["add"].step(), t["add"].step(), id="nightly").enqueue()

    assert again.existing
    assert [j.id for j in again.jobs] == [j.id for j in first.jobs]
    assert len(app.jobs()) == 2
    assert app.workflow("nightly").jobs[0].args == [1]


def test_chain_group_and_chord_build_the_common_shapes(app: App) -> None:
    t = tasks(app)
    chained = chain(t["value"].step(3), t["add"].step(extra=1), t["add"].step(extra=1)).enqueue()
    grouped = group(t["value"].step(1), t["value"].step(2)).enqueue()
    chorded = chord([t["value"].step(n) for n in range(5)], t["add"].step()).enqueue()

    assert drain(app) == {"succeeded": 3 + 2 + 6}
    assert app.get(chained.jobs[-1].id).result == 5
    assert [app.get(j.id).result for j in grouped.jobs] == [1, 2]
    assert app.get(chorded.jobs[-1].id).result == 10


def test_a_failed_node_is_named_and_stops_what_depends_on_it(app: App) -> None:
    t = tasks(app)
    wf = Workflow()
    bad = wf.add(t["boom"].step())
    ok = wf.add(t["value"].step(1))
    wf.add(t["add"].step(), after=[bad, ok])
    wf.add(t["add"].step(), after=[ok], after_failure="run")
    run = wf.enqueue()

    drain(app)

    status = run.wait(timeout=5)
    assert status.finished and not status.succeeded
    assert status.counts == {"cancelled": 1, "failed": 1, "succeeded": 2}
    assert status.failed_job is not None and status.failed_job.id == run.jobs[0].id


def test_a_whole_workflow_is_cancelled(app: App) -> None:
    t = tasks(app)
    run = chain(*[t["add"].step() for _ in range(4)], id="to-cancel").enqueue()

    assert run.cancel() == 4

    assert run.status().counts == {"cancelled": 4}
    assert drain(app) == {}


def test_a_workflow_is_enqueued_all_or_nothing(app: App) -> None:
    t = tasks(app)
    wf = Workflow("broken")
    wf.add(t["value"].step(1))
    wf.add(t["add"].step(), after=[999_999])  # no such job

    with pytest.raises(InvalidJobError, match="after names job 999999"):
        wf.enqueue()

    assert app.jobs() == []
    assert app.workflows() == []
    fixed = Workflow("broken")
    fixed.add(t["value"].step(1))
    assert not fixed.enqueue().existing


def test_a_node_waits_only_for_nodes_before_it_so_there_is_no_cycle(app: App) -> None:
    t = tasks(app)
    one, other = Workflow(), Workflow()
    node = one.add(t["value"].step(1))
    with pytest.raises(InvalidJobError, match="a node of another workflow"):
        other.add(t["add"].step(), after=[node])
    with pytest.raises(InvalidJobError, match="has no steps"):
        Workflow("empty").enqueue()
    with pytest.raises(InvalidJobError, match="workflow takes steps"):
        one.add(t["value"])  # type: ignore[arg-type]


def test_nodes_cannot_name_each_others_future_ids(app: App) -> None:
    # A node waits only for nodes before it; an id is a stored job's, which
    # must exist before the workflow: two nodes naming the ids they are about
    # to get would wait for each other forever.
    t = tasks(app)
    before = t["value"].enqueue(1)
    wf = Workflow("cycle")
    wf.add(t["add"].step(), after=[before.id + 2])
    wf.add(t["add"].step(), after=[before.id + 1])

    with pytest.raises(InvalidJobError, match=rf"after names job {before.id + 2}, which does not"):
        wf.enqueue()

    assert [j.id for j in app.jobs()] == [before.id]
    assert app.workflows() == []


def test_a_node_may_wait_for_stored_jobs(app: App) -> None:
    t = tasks(app)
    before = t["value"].enqueue(100)
    wf = Workflow()
    wf.add(t["add"].step(), after=[before])
    run = wf.enqueue()
    assert run.jobs[0].state == JobState.WAITING
    drain(app)
    assert app.get(run.jobs[0].id).result == 100


def test_a_wide_fan_in_and_a_big_graph(app: App) -> None:
    t = tasks(app)
    parents = [t["value"].step(1) for _ in range(1000)]
    run = chord(parents, t["add"].step(), id="wide").enqueue()
    assert run.status().counts == {"queued": 1000, "waiting": 1}
    store = app.store
    claimed = store.job_claim(["default"], 1000, "w", timedelta(seconds=60))
    store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed])
    assert app.get(run.jobs[-1].id).state == JobState.QUEUED
    assert drain(app) == {"succeeded": 1}
    assert app.get(run.jobs[-1].id).result == 1000


def test_inline_mode_runs_a_whole_workflow_before_enqueue_returns(app: App) -> None:
    from conveyor.testing import inline

    t = tasks(app)
    with inline(app):
        run = chain(t["value"].step(1), t["add"].step(extra=1), t["add"].step(extra=1)).enqueue()
    assert [(j.state, j.result) for j in run.jobs] == [
        (JobState.SUCCEEDED, 1),
        (JobState.SUCCEEDED, 2),
        (JobState.SUCCEEDED, 3),
    ]
