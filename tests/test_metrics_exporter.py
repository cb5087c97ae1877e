"""/metrics for Prometheus on every store: per-task counters and histograms read
from the store (the same text from the exporter and from a dashboard), parsed
with prometheus_client; and ``conveyor metrics`` serving it alone."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from conveyor import App
from conveyor.job import utcnow
from conveyor.store.records import Finish
from conveyor.version import __version__
from conveyor.web import create_app
from conveyor.web.exporter import create_metrics_app

LEASE = timedelta(seconds=30)


def run_some(app: App) -> None:
    """Two tasks of one queue: 3 sends that succeed, one digest that fails for good."""
    for n in range(3):
        app.enqueue("send", [n], queue="mail")
    app.enqueue("digest", [], queue="mail", max_attempts=1)
    now = utcnow()
    for job in app.store.job_claim(["mail"], 4, "w1", LEASE, now):
        token = job.lease_token or ""
        done = now + timedelta(seconds=0.3)
        if job.task == "send":
            app.store.job_finish([Finish.complete(job.id, token, None)], done)
        else:
            app.store.job_finish([Finish(job.id, token, "fail", error="boom")], done)


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, []).append((s.labels, s.value))
    return found


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    (got,) = [v for ls, v in found.get(name, []) if ls == labels]
    return got


def test_exporter_serves_task_metrics(app: App) -> None:
    run_some(app)
    with TestClient(create_metrics_app(app), base_url="http://127.0.0.1") as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert client.get("/healthz").status_code == 200
        assert client.get("/").status_code == 404  # nothing but the two
        again = client.get("/metrics").text
    found = families(response.text)
    assert value(found, "conveyor_build_info", version=__version__) == 1
    assert value(found, "conveyor_up") == 1
    assert value(found, "conveyor_jobs_enqueued_total", queue="mail", task="send") == 3
    assert value(found, "conveyor_jobs_succeeded_total", queue="mail", task="send") == 3
    assert value(found, "conveyor_jobs_failed_total", queue="mail", task="digest") == 1
    assert value(found, "conveyor_jobs_failed_total", queue="mail", task="send") == 0
    run = "conveyor_job_run_seconds"
    assert value(found, f"{run}_count", queue="mail", task="send") == 3
    assert value(found, f"{run}_sum", queue="mail", task="send") > 0.8
    # 0.3 s: above the 0.256 bound, within 1.024.
    assert value(found, f"{run}_bucket", queue="mail", task="send", le="0.256") == 0
    assert value(found, f"{run}_bucket", queue="mail", task="send", le="1.024") == 3
    wait = "conveyor_job_queue_wait_seconds"
    assert value(found, f"{wait}_count", queue="mail", task="digest") == 1
    assert value(found, f"{wait}_bucket", queue="mail", task="digest", le="+Inf") == 1

    # A dashboard on the same store reads the same counters; a scrape again, the same.
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        dashboard = families(client.get("/metrics").text)
    for name in ("conveyor_jobs_succeeded_total", f"{run}_bucket", f"{wait}_sum"):
        assert dashboard[name] == found[name] == families(again)[name]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_conveyor_metrics_command(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'q.db'}"
    app = App(dsn)
    app.migrate()
    run_some(app)
    app.close()
    port = free_port()
    command = [sys.executable, "-m", "conveyor", "metrics", "--dsn", dsn, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        found = families(text)
        assert value(found, "conveyor_jobs_succeeded_total", queue="mail", task="send") == 3
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_conveyor_metrics_without_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nothere.db"
    result = subprocess.run(
        [sys.executable, "-m", "conveyor", "metrics", "--dsn", f"sqlite:///{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "nothere.db" in result.stderr
