"""Cancelling parked parents in bulk (the App's bulk operations, the CLI) cancels the
children each waits for (ctx.wait), and theirs, as the single cancel does: decided in
the store's cancel statement or script, on every store."""

from __future__ import annotations

import os
import re
from typing import Any

from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from conveyor import App, Context, JobState
from conveyor.cli import cli
from conveyor.signals import spawned
from conveyor.store.dsn import DSN_ENV
from conveyor.testing import drain
from conveyor.web import create_app


def run(*args: str) -> Result:
    env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def three_levels(app: App) -> None:
    """top waits for a mid, which waits for two leaves; napper spawns a leaf and sleeps."""

    @app.task(queue="leaves")
    def leaf(n: int) -> int:
        return n

    @app.task(queue="mids")
    def mid(ctx: Context) -> Any:
        return ctx.wait([ctx.spawn(leaf, 1), ctx.spawn(leaf, 2)])

    @app.task(queue="tops")
    def top(ctx: Context) -> Any:
        return ctx.wait(ctx.spawn(mid))

    @app.task(queue="tops")
    def napper(ctx: Context) -> None:
        ctx.spawn(leaf, 3)
        ctx.sleep(3600)  # parked, but waits for no child


def descendants(app: App, job_id: int) -> list[int]:
    found = []
    for child in spawned(app.steps(job_id)):
        found += [child, *descendants(app, child)]
    return found


def parked_family(app: App) -> tuple[list[int], list[int], int]:
    """Two tops parked with their mids and leaves; a napper and its leaf. The tops, their
    descendants, and the napper's leaf."""
    tops = [app.get_task("top").enqueue().id for _ in range(2)]
    napper = app.get_task("napper").enqueue()
    assert drain(app, ["tops"]) == {"snoozed": 3}
    assert drain(app, ["mids"]) == {"snoozed": 2}
    family = [i for top in tops for i in descendants(app, top)]
    assert len(family) == 6
    (napper_leaf,) = spawned(app.steps(napper.id))
    return tops, family, napper_leaf


def test_a_bulk_cancel_cancels_the_children_of_each_parked_parent(app: App) -> None:
    three_levels(app)
    tops, family, napper_leaf = parked_family(app)
    changed = app.cancel_jobs(queue="tops")
    assert changed == 3 + len(family)  # both tops, the napper, and the tops' families
    assert {app.get(i).state for i in tops + family} == {JobState.CANCELLED}
    assert app.get(napper_leaf).state == JobState.QUEUED  # not waited for: it runs on
    assert drain(app, ["leaves", "mids", "tops"]) == {"succeeded": 1}


def test_cancelling_a_mid_alone_leaves_its_parent_and_takes_its_leaves(app: App) -> None:
    three_levels(app)
    tops, family, _ = parked_family(app)
    mid = spawned(app.steps(tops[0]))[0]
    assert app.cancel(mid).state == JobState.CANCELLED
    leaves = spawned(app.steps(mid))
    assert [app.get(i).state for i in leaves] == [JobState.CANCELLED] * 2
    assert app.get(tops[0]).state == JobState.QUEUED  # the parent finds it cancelled later
    others = [i for i in family if i != mid and i not in leaves]
    assert {app.get(i).state for i in others} == {JobState.QUEUED}


def test_the_cli_bulk_cancel_cascades_too(app: App, dsn: str) -> None:
    three_levels(app)
    tops, family, napper_leaf = parked_family(app)
    said = run("jobs", "cancel", "--queue", "tops", "--yes", "--dsn", dsn).stdout
    assert f"{3 + len(family)} job(s) cancelled" in said
    assert {app.get(i).state for i in tops + family} == {JobState.CANCELLED}
    assert app.get(napper_leaf).state == JobState.QUEUED


def test_the_dashboards_bulk_cancel_cascades_too(app: App) -> None:
    three_levels(app)
    tops, family, napper_leaf = parked_family(app)
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        match = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/jobs").text)
        assert match
        form = {"csrf_token": match.group(1), "action": "cancel", "id": [str(i) for i in tops]}
        response = client.post("/jobs/bulk", data=form, follow_redirects=False)
    assert response.headers["location"].endswith(f"notice=bulk_cancel&n={2 + len(family)}")
    assert {app.get(i).state for i in tops + family} == {JobState.CANCELLED}
    assert app.get(napper_leaf).state == JobState.QUEUED
