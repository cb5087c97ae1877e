"""A dead worker's jobs are counted once, the same way, on every surface; and it leaves the lists.

The count is of the running jobs the store says the worker holds (what a
take-back would take), not what its last check-in said: a worker that died
after its jobs were rescued still reported them.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.fleet import FORGET_AFTER
from conveyor.job import utcnow
from conveyor.web import create_app

LEASE = timedelta(seconds=30)


def stats_json(dsn: str) -> dict[str, object]:
    result = CliRunner().invoke(cli, ["stats", "--json", "--dsn", dsn])
    assert result.exit_code == 0, result.output
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_a_dead_workers_jobs_are_one_count_everywhere(app: App, dsn: str) -> None:
    for n in range(3):
        app.enqueue("render", [n], queue="reports")
    now = utcnow()
    silent = now - timedelta(seconds=45)
    app.store.worker_register("dead-1", "host-b", 22, ["reports"], 4, silent)
    (held,) = app.store.job_claim(["reports"], 1, "dead-1", LEASE, now)
    # Its last check-in said 3 jobs; the store says it holds 1.
    app.store.worker_beat("dead-1", 3, silent)

    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        overview = client.get("/").text
        workers = client.get("/workers").text
        metrics = client.get("/metrics").text
    row = re.search(r"<td class=\"mono title\">dead-1</td>.*?</tr>", overview, re.DOTALL)
    assert row is not None
    assert "1 / 4" in row.group(0) and "3 / 4" not in row.group(0)
    assert "probably dead" in row.group(0)
    assert "1 of 4 slots busy" in workers and "Take back its 1 job(s)" in workers
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    (in_hand,) = families["conveyor_worker_jobs_in_hand"].samples
    assert in_hand.labels == {"host": "host-b"} and in_hand.value == 1
    assert families["conveyor_workers"].samples[0].value == 1

    stats = stats_json(dsn)
    (worker,) = stats["workers"]  # type: ignore[misc]
    assert worker["jobs_in_hand"] == 1 and worker["jobs"] == [held.id]
    assert worker["probably_dead"] is True
    table = CliRunner().invoke(cli, ["stats", "--dsn", dsn], env={"COLUMNS": "120"}).stdout
    line = next(line for line in table.splitlines() if "dead-1" in line)
    assert "1/4" in line and "3/4" not in line and "probably dead" in line


def test_a_silent_worker_leaves_every_list_after_a_minute_unpruned(app: App, dsn: str) -> None:
    long_ago = utcnow() - FORGET_AFTER - timedelta(seconds=5)
    app.store.worker_register("gone-1", "host-c", 33, ["reports"], 2, long_ago)
    app.store.worker_register("live-1", "host-d", 44, ["reports"], 2, utcnow())
    # No worker runs to prune it: its row is still in the store.
    assert {w.id for w in app.store.worker_list()} == {"gone-1", "live-1"}
    assert [w.info.id for w in app.workers()] == ["live-1"]
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        assert "gone-1" not in client.get("/").text
        assert "gone-1" not in client.get("/workers").text
        metrics = client.get("/metrics").text
    assert re.search(r"^conveyor_workers 1(\.0)?$", metrics, re.MULTILINE)
    assert [w["id"] for w in stats_json(dsn)["workers"]] == ["live-1"]  # type: ignore[attr-defined]
