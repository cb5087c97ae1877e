"""Limits where operators meet them: conveyor limit, limits and stats; /metrics; the overview."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.limits import Limit, Rate
from conveyor.web import create_app


def run(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def run_json(*args: str) -> Any:
    return json.loads(run(*args, "--json").stdout)


@pytest.fixture
def busy(app: App) -> Iterator[App]:
    """Ready jobs on a queue "api": five without a key, three of key c1, one of c2."""

    @app.task(queue="api")
    def call() -> None:
        return None

    call.enqueue_many([((), {})] * 5)
    call.options(limit_key="c1").enqueue_many([((), {})] * 3)
    call.options(limit_key="c2").enqueue()
    yield app


def test_limits_are_set_shown_and_cleared_on_the_command_line(busy: App, dsn: str) -> None:
    out = run("limit", "api", "--rate", "10/s", "--concurrency", "3", "--dsn", dsn).stdout
    assert out.strip() == "queue api: 10/s, 3 at once"
    out = run("limit", "api", "--per-key", "--concurrency", "1", "--dsn", dsn).stdout
    assert out.strip() == "each key of queue api: 1 at once"
    stored = busy.store.limit_get("api")
    assert stored is not None
    assert stored.limit == Limit(Rate(10, 1.0), 3)
    assert stored.key_limit == Limit(None, 1)

    shown = run_json("limits", "--dsn", dsn)["api"]
    assert shown["limit"] == {
        "rate": "10/s",
        "rate_count": 10,
        "rate_seconds": 1.0,
        "concurrency": 3,
    }
    # Nothing runs: the queue has room for 3 of its 9 ready jobs; key c1 for 1 of its 3.
    assert (shown["ready"], shown["room"], shown["held_back"]) == (9, 3, 6)
    table = run("limit", "api", "--dsn", dsn).stdout
    assert "10/s, 3 at once" in table and "1 at once each" in table and "6 of 9 ready" in table

    stats = run_json("stats", "--dsn", dsn)
    assert stats["limits"]["api"]["held_back"] == 6
    assert "Limits" in run("stats", "--dsn", dsn).stdout

    run("limit", "api", "--clear", "--dsn", dsn)
    run("limit", "api", "--per-key", "--clear", "--dsn", dsn)
    assert run_json("limits", "--dsn", dsn) == {}
    assert "no queue has a limit" in run("limits", "--dsn", dsn).stdout


def test_throttles_on_the_command_line(busy: App, dsn: str) -> None:
    out = run("limit", "api", "--throttle", "5m", "--key", "c1", "--dsn", dsn).stdout
    assert out.startswith("key c1 of queue api throttled until")
    shown = run_json("limits", "--dsn", dsn)["api"]
    assert (shown["keys_throttled"], shown["keys_full"], shown["held_back"]) == (1, 1, 3)
    run("limit", "api", "--throttle", "30s", "--dsn", dsn)
    assert run_json("limits", "--dsn", dsn)["api"]["held_back"] == 9
    assert "lifted" in run("limit", "api", "--throttle", "0", "--dsn", dsn).stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "fast"], "cannot read rate"),
        (["--rate", "0/s"], "1 to"),
        (["--concurrency", "0"], "concurrency must be from 1"),
        (["--clear", "--rate", "1/s"], "not both"),
        (["--key", "c1"], "--throttle"),
        (["--throttle", "1m", "--rate", "1/s"], "alone"),
    ],
)
def test_bad_limits_are_refused_on_the_command_line(
    busy: App, dsn: str, args: list[str], message: str
) -> None:
    result = run("limit", "api", *args, "--dsn", dsn, code=2)
    assert message in result.stderr
    assert busy.store.limit_get("api") is None  # nothing was written


def test_limit_key_is_an_option_of_conveyor_enqueue(app: App, dsn: str) -> None:
    job = run_json(
        "enqueue", "call", "--queue", "api", "--limit-key", "c9", "--any-task", "--dsn", dsn
    )
    assert job["limit_key"] == "c9"
    assert app.get(job["id"]).limit_key == "c9"


def test_metrics_and_the_overview_show_each_limit(busy: App) -> None:
    busy.limit("api", rate="20/s", concurrency=3)
    busy.limit("api", concurrency=1, per_key=True)
    busy.throttle("api", 60, limit_key="c2")
    with TestClient(create_app(busy), base_url="http://127.0.0.1") as client:
        metrics = client.get("/metrics").text
        page = client.get("/").text
    samples = {
        series: float(value)
        for series, value in re.findall(r"^(conveyor_limit_[^ ]+) (\S+)$", metrics, re.MULTILINE)
    }
    assert samples['conveyor_limit_rate{queue="api",scope="queue"}'] == 20
    assert samples['conveyor_limit_rate_window_seconds{queue="api",scope="queue"}'] == 1
    assert samples['conveyor_limit_concurrency{queue="api",scope="queue"}'] == 3
    assert samples['conveyor_limit_concurrency{queue="api",scope="key"}'] == 1
    assert samples['conveyor_limit_running{queue="api"}'] == 0
    # The keys hold back 3 (c1 has room for 1 of its 3, c2 none); of the 6 left, 3 fit.
    assert samples['conveyor_limit_held_back{queue="api"}'] == 6
    assert samples['conveyor_limit_keys_throttled{queue="api"}'] == 1
    assert samples['conveyor_limit_throttled_seconds{queue="api"}'] == 0
    assert "# TYPE conveyor_limit_held_back gauge" in metrics
    assert "<h2>Limits</h2>" in page
    assert "20/s, 3 at once" in page and "1 at once each" in page
    assert "0 running; limit 3" in page and "6</span>" in page
    assert "0 started in the last second; limit 20" in page


def test_the_overview_has_no_limits_block_without_limits(app: App) -> None:
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        assert "<h2>Limits</h2>" not in client.get("/").text
