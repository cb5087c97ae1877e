"""The enqueue option fair_key=: a fair queue's turns go by it (by the job's
limit_key when not given, by the shared key when None) while per-key limits keep
counting by limit_key, on every store; counted, never timed."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import timedelta

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import Job
from conveyor.store.dsn import DSN_ENV
from conveyor.store.fair import fair_key_of
from conveyor.task import EnqueueOptions
from conveyor.web import create_app

LEASE = timedelta(minutes=5)


def _enqueue(app: App, count: int, **options: object) -> dict[int, str | None]:
    """``count`` jobs of queue q with these options, in one transaction: id -> the key
    each should take turns by."""
    opts = EnqueueOptions(queue="q", **options)  # type: ignore[arg-type]
    jobs = app.enqueue_calls("t", [((), {})] * count, opts)
    turn = options.get("fair_key", options.get("limit_key"))
    return {j.id: turn for j in jobs}  # type: ignore[misc]


def _claim(app: App, count: int, per_claim: int = 10) -> list[Job]:
    got: list[Job] = []
    while len(got) < count:
        claimed = app.store.job_claim(["q"], per_claim, "w", LEASE)
        if not claimed:
            break
        got += claimed
    return got


def test_turns_go_by_fair_key_while_the_limit_key_is_shared(app: App) -> None:
    app.fair("q")
    turns = _enqueue(app, 2000, limit_key="region-1", fair_key="A")
    assert Counter(turns[j.id] for j in _claim(app, 20)) == {"A": 20}
    turns |= _enqueue(app, 100, limit_key="region-1", fair_key="B")
    turns |= _enqueue(app, 100, limit_key="region-1", fair_key="C")
    keys = {k.key: k.queued for k in app.fair_queues()["q"].keys}
    assert keys == {"A": 1980, "B": 100, "C": 100}, keys
    started: Counter[str | None] = Counter()
    while started["B"] + started["C"] < 200:
        started.update(turns[j.id] for j in _claim(app, 10))
    # By limit_key alone (one key) B and C would wait behind all of A's 1,980; by
    # fair key A has a third of the starts meanwhile (and a claim's worth more).
    assert started["A"] <= 110, started
    assert started["B"] == started["C"] == 100


def test_without_fair_key_the_turns_go_by_limit_key(app: App) -> None:
    app.fair("q")
    # The shared key's jobs are looked for among the first ready ones: enqueued first.
    turns = _enqueue(app, 100, limit_key="C", fair_key=None)  # the shared key
    turns |= _enqueue(app, 50, limit_key="x", fair_key="B")
    turns |= _enqueue(app, 50, limit_key="B")  # shares B's turns with the line above
    turns |= _enqueue(app, 500, limit_key="A")  # no fair_key: by its limit_key
    started = Counter(turns[j.id] for j in _claim(app, 60))
    # A turn each (Redis looks at the head of the queue first: a claim's worth off).
    assert set(started) == {"A", "B", None}, started
    assert all(17 <= n <= 23 for n in started.values()), started
    keys = {k.key: k.queued for k in app.fair_queues()["q"].keys}
    assert keys == {key: n - started[key] for key, n in Counter(turns.values()).items()}, keys


def test_per_key_limits_still_count_by_limit_key(app: App) -> None:
    app.limit("q", concurrency=5, per_key=True)
    app.fair("q")
    _enqueue(app, 100, limit_key="L1", fair_key="A")
    _enqueue(app, 100, limit_key="L1", fair_key="B")
    _enqueue(app, 100, limit_key="L2", fair_key="C")
    got = _claim(app, 30)
    # Two fair keys share L1's room of 5; C has L2's to itself.
    assert Counter(j.limit_key for j in got) == {"L1": 5, "L2": 5}
    assert app.store.job_claim(["q"], 10, "w", LEASE) == []


def test_a_fair_key_equal_to_the_limit_key_stores_nothing_more(app: App) -> None:
    job = app.enqueue("t", queue="q", limit_key="A", fair_key="A")
    assert fair_key_of(app.store, job.id) is None
    job = app.enqueue("t", queue="q", limit_key="A", fair_key="B")
    assert fair_key_of(app.store, job.id) == "B"
    job = app.enqueue("t", queue="q", limit_key="A", fair_key=None)
    assert fair_key_of(app.store, job.id) == ""


@pytest.mark.parametrize("bad", ["", "  ", 5])
def test_a_bad_fair_key_is_refused(app: App, bad: object) -> None:
    with pytest.raises(InvalidJobError, match="fair_key"):
        app.enqueue("t", queue="q", fair_key=bad)


def test_jobs_show_and_the_job_page_show_a_fair_key_of_its_own(app: App, dsn: str) -> None:
    own = app.enqueue("t", queue="q", limit_key="L", fair_key="tenant<1>")
    shared = app.enqueue("t", queue="q", limit_key="L", fair_key=None)
    by_limit_key = app.enqueue("t", queue="q", limit_key="L")

    def show(job_id: int, *more: str) -> str:
        env: dict[str, str | None] = {DSN_ENV: os.environ.get(DSN_ENV)}
        result = CliRunner().invoke(
            cli, ["--dsn", dsn, "jobs", "show", str(job_id), *more], env=env
        )
        assert result.exit_code == 0, (result.stdout, result.exception)
        return result.stdout

    assert json.loads(show(own.id, "--json"))["fair_key"] == "tenant<1>"
    assert json.loads(show(shared.id, "--json"))["fair_key"] == ""
    assert json.loads(show(by_limit_key.id, "--json"))["fair_key"] is None
    assert "fair key: tenant<1>" in show(own.id)
    assert "fair key" not in show(by_limit_key.id)
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{own.id}").text
        assert "Fair key" in page and "tenant&lt;1&gt;" in page  # a key is data, escaped
        assert "shared (no key)" in client.get(f"/jobs/{shared.id}").text
        assert "Fair key" not in client.get(f"/jobs/{by_limit_key.id}").text


def test_a_task_gives_its_jobs_a_fair_key_that_an_enqueue_overrides(app: App) -> None:
    @app.task(queue="q", fair_key="reports")
    def report() -> None: ...

    assert fair_key_of(app.store, report.enqueue().id) == "reports"
    assert fair_key_of(app.store, report.options(fair_key="A").enqueue().id) == "A"
    shared = report.options(limit_key="L", fair_key=None).enqueue()
    assert fair_key_of(app.store, shared.id) == ""
    with pytest.raises(ConfigurationError, match="fair_key"):
        app.task(name="bad", fair_key="")(lambda: None)
