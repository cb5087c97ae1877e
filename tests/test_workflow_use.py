"""Workflows used wrongly say what to write instead; a node's label names its job on the graph."""

from __future__ import annotations

import html
from typing import Any

import pytest
from starlette.testclient import TestClient

from conveyor import App, Workflow
from conveyor.errors import InvalidJobError
from conveyor.web import create_app
from conveyor.web.graph import LABEL_CHARS
from conveyor.workflow import LABEL_HEADER, chain, chord, group


@pytest.fixture
def extract(app: App) -> Any:
    @app.task()
    def extract(month: str) -> str:
        return month

    return extract


def test_after_takes_one_node_job_or_id_as_well_as_a_list(app: App, extract: Any) -> None:
    wf = Workflow("single-after")
    first = wf.add(extract.step("01"))
    second = wf.add(extract.step("02"), after=first)  # one node, no list needed
    stored = app.enqueue("extract", ["00"])
    third = wf.add(extract.step("03"), after=stored)
    fourth = wf.add(extract.step("04"), after=stored.id)
    together = wf.group(extract.step("05"), extract.step("06"), after=second)
    chained = wf.chain(extract.step("07"), after=first)
    assert second.after == (0,) and third.after_jobs == (stored.id,)
    assert fourth.after_jobs == (stored.id,)
    assert [n.after for n in together] == [(1,), (1,)] and chained[0].after == (0,)
    run = wf.enqueue()
    assert len(run.jobs) == 7
    assert [p.id for p in app.parents(run.jobs[1].id)] == [run.jobs[0].id]


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ("5", "after takes a node, a Job or a job id, or a list of them, got str '5'"),
        (b"5", "got bytes b'5'"),
        (3.5, "got float 3.5"),
        (None, "got NoneType None"),
        ([None], "after must name nodes, Jobs or job ids"),
        ([[1]], "after must name nodes, Jobs or job ids"),
        (True, "after must name nodes, Jobs or job ids"),
        (0, "after must name nodes, Jobs or job ids"),
    ],
)
def test_wrong_after_is_refused_with_what_to_write(
    app: App, extract: Any, after: Any, message: str
) -> None:
    wf = Workflow("bad-after")
    with pytest.raises(InvalidJobError, match=message.replace("(", r"\(").replace(")", r"\)")):
        wf.add(extract.step("01"), after=after)
    with pytest.raises(InvalidJobError, match="after"):
        wf.group(extract.step("01"), after=after)
    assert wf.nodes == []


def test_wrong_steps_are_refused_with_what_to_write(app: App, extract: Any) -> None:
    wf = Workflow("bad-steps")
    with pytest.raises(InvalidJobError, match=r"the task 'extract' itself: write extract.step"):
        wf.add(extract)
    with pytest.raises(InvalidJobError, match=r"takes steps \(task.step\(\*args\)\), got str"):
        wf.add("extract")  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="the task 'extract' itself"):
        chain(extract.step("01"), extract)
    with pytest.raises(InvalidJobError, match="the task 'extract' itself"):
        group(extract)
    with pytest.raises(InvalidJobError, match="a chord's header is a list of steps"):
        wf.chord(extract.step("01"), extract.step("02"))  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="a chord's header is a list of steps"):
        chord(extract, extract.step("02"))  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="a chord's callback takes steps"):
        wf.chord([extract.step("01")], extract)
    with pytest.raises(InvalidJobError, match="after_failure must be 'cancel' or 'run'"):
        wf.add(extract.step("01"), after_failure="skip")  # type: ignore[arg-type]
    other = Workflow("other")
    foreign = other.add(extract.step("01"))
    with pytest.raises(InvalidJobError, match="a node of another workflow"):
        wf.add(extract.step("02"), after=foreign)
    with pytest.raises(InvalidJobError, match="workflow id must be a string, got int"):
        Workflow(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="has no steps"):
        Workflow("empty").enqueue()
    with pytest.raises(InvalidJobError, match="a node's label must be a string"):
        wf.add(extract.step("01"), label=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="a node's label must not be empty"):
        wf.add(extract.step("01"), label=" ")
    with pytest.raises(InvalidJobError, match="a node's label must be a string, got int"):
        wf.add(extract.step("01"), label=lambda args, kwargs: len(args))  # type: ignore[arg-type,return-value]
    assert wf.nodes == []


def test_a_label_names_the_node_on_the_graph(app: App, extract: Any) -> None:
    wf = Workflow("monthly")
    months = [
        wf.add(extract.options(headers={"trace": "t1"}).step(m), label=f"extract <{m}>")
        for m in ("2026-01", "2026-02")
    ]
    made = wf.add(extract.step("all"), after=months, label=lambda args, kwargs: f"all of {args[0]}")
    assert made.step.options.headers == {LABEL_HEADER: "all of all"}
    wf.add(extract.step("all"), after=made)
    run = wf.enqueue()
    first = app.get(run.jobs[0].id)
    assert first.headers == {"trace": "t1", LABEL_HEADER: "extract <2026-01>"}
    assert LABEL_HEADER not in app.get(run.jobs[3].id).headers
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get("/workflows/monthly").text
    texts = [html.unescape(t) for t in page.split("<text ")[1:]]
    shown = [t.split(">", 1)[1].split("</text>")[0] for t in texts]
    # Cut to the box with the id whole; the tooltip has the whole label.
    assert len(shown[0]) == LABEL_CHARS and "…" in shown[0]
    assert shown[0].endswith(f" #{run.jobs[0].id}") and shown[0].startswith("extract <")
    assert shown[3] == f"extract #{run.jobs[3].id}"
    assert shown[2] == f"all of all #{run.jobs[2].id}"
    assert f"job {run.jobs[1].id} · extract &lt;2026-02&gt; · extract" in page
