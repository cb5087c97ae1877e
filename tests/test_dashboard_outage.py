"""The dashboard while its store is away: real outages on every store, and the recovery.

PostgreSQL and redis-server are stopped and started again under a running
dashboard; a SQLite file's folder goes away (a disk unmounted) and comes back,
and another process holds SQLite's write lock. Every page answers 503 in the
page frame, naming the store and saying it retries; /metrics answers
``conveyor_up 0``; then every page comes back by itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import conveyor.web.outage
from conveyor import App
from conveyor.job import JobState
from conveyor.web import create_app
from dashboard_seed import Seeded, seed
from pg_server import PgServer
from redis_server import RedisServer

BASE = "http://127.0.0.1"


def pages(ids: Seeded) -> list[str]:
    return [
        "/",
        "/live",
        "/jobs",
        "/jobs?state=failed",
        f"/jobs/{ids.failed_id}",
        "/jobs/confirm?action=retry&state=failed",
        "/workers",
        "/periodic",
        "/purge?older_than=7d",
        "/queues/mail/delete",
    ]


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is tried again every half second instead of five."""
    monkeypatch.setattr(conveyor.web.outage, "RETRY_SECONDS", 0.5)


def csrf_of(text: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', text)
    assert match
    return match.group(1)


def assert_down(client: TestClient, ids: Seeded, store: str, secret: str | None = None) -> None:
    """Every page 503 in its frame, naming the store; /metrics up 0."""
    for path in pages(ids):
        answer = client.get(path)
        assert answer.status_code == 503, (path, answer.text[:300])
        text = answer.text
        assert "Internal Server Error" not in text
        if path == "/live":
            continue
        assert '<header class="top">' in text and "<nav>" in text, path  # the page frame
        assert "The store cannot be reached" in text, path
        assert store in text, (path, store)
        assert "retries every" in text and 'http-equiv="refresh"' in text, path
        if secret is not None:
            assert secret not in text
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "# TYPE conveyor_up gauge" in metrics.text
    assert re.search(r"^conveyor_up 0(\.0)?$", metrics.text, re.MULTILINE)
    assert "conveyor_jobs{" not in metrics.text
    health = client.get("/healthz")
    assert health.status_code == 503 and health.json()["ok"] is False


def wait_up(client: TestClient, ids: Seeded, timeout: float = 60) -> None:
    """Every page answers 200 again, without a restart of the dashboard."""
    deadline = time.monotonic() + timeout
    while client.get("/").status_code != 200:
        assert time.monotonic() < deadline, "the dashboard did not recover"
        time.sleep(0.2)
    for path in pages(ids):
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text[:300])
        assert "The store cannot be reached" not in answer.text
    metrics = client.get("/metrics")
    assert re.search(r"^conveyor_up 1(\.0)?$", metrics.text, re.MULTILINE)
    assert "conveyor_jobs{" in metrics.text


def outage_and_recovery(
    app: App, stop: Callable[[], None], start: Callable[[], None], store: str, secret: str | None
) -> None:
    ids = seed(app)
    with TestClient(create_app(app), base_url=BASE) as client:
        wait_up(client, ids)
        token = csrf_of(client.get(f"/jobs/{ids.failed_id}").text)
        stop()
        assert_down(client, ids, store, secret)
        # An action while the store is away: 503 in the frame, saying nothing was done.
        acted = client.post(
            f"/jobs/{ids.failed_id}/retry", data={"csrf_token": token}, follow_redirects=False
        )
        assert acted.status_code == 503 and "Nothing was done" in acted.text
        # Pages asked meanwhile answer at once: no connection timeout per page.
        started = time.monotonic()
        for _ in range(5):
            assert client.get("/jobs").status_code == 503
        assert time.monotonic() - started < 3
        start()
        wait_up(client, ids)
        retried = client.post(
            f"/jobs/{ids.failed_id}/retry", data={"csrf_token": token}, follow_redirects=False
        )
        assert retried.status_code == 303
    assert app.get(ids.failed_id).state == JobState.QUEUED


def test_postgres_stopped_then_started(tmp_path: Path) -> None:
    server = PgServer()
    server.start()
    try:
        # A password in the DSN (the test server trusts loopback): never shown on a page.
        dsn = server.dsn.replace("://postgres@", "://postgres:s3cret-pw@")
        assert "s3cret-pw" in dsn
        with App(dsn, connect_timeout=2) as app:
            app.migrate()
            outage_and_recovery(
                app, server.halt, server.start, f"PostgreSQL at 127.0.0.1:{server.port}/", "s3cret"
            )
    finally:
        server.stop()


@pytest.mark.redis
def test_redis_stopped_then_started() -> None:
    server = RedisServer(appendfsync="always")
    server.start()
    try:
        with App(server.dsn, connect_timeout=2) as app:
            app.migrate()
            outage_and_recovery(
                app, server.kill, server.start, f"Redis at 127.0.0.1:{server.port}", None
            )
    finally:
        server.stop()


def test_sqlite_file_that_cannot_be_opened_then_can(tmp_path: Path) -> None:
    folder = tmp_path / "disk"
    folder.mkdir()
    away = tmp_path / "unmounted"
    path = folder / "jobs.db"
    with App(f"sqlite:///{path}", busy_timeout=1.0) as app:
        app.migrate()
        ids = seed(app)
        # The pages are served from threads of their own, each opening the file when it
        # first needs it: with its folder away (a disk unmounted), none can.
        folder.rename(away)
        with TestClient(create_app(app), base_url=BASE) as client:
            assert_down(client, ids, f"SQLite database {path}")
            assert "unable to open database file" in client.get("/jobs").text
            away.rename(folder)
            wait_up(client, ids)
            token = csrf_of(client.get(f"/jobs/{ids.failed_id}").text)
            retried = client.post(
                f"/jobs/{ids.failed_id}/retry", data={"csrf_token": token}, follow_redirects=False
            )
            assert retried.status_code == 303
        assert app.get(ids.failed_id).state == JobState.QUEUED


HOLD_WRITE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE jobs SET priority = priority WHERE id = 1")
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def write_lock_holder() -> Iterator[Callable[[Path], Any]]:
    held: list[subprocess.Popen[str]] = []

    def hold(path: Path) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLD_WRITE_LOCK, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        held.append(process)
        return process

    yield hold
    for process in held:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_sqlite_locked_by_another_process(
    tmp_path: Path, write_lock_holder: Callable[[Path], subprocess.Popen[str]]
) -> None:
    path = tmp_path / "jobs.db"
    with App(f"sqlite:///{path}", busy_timeout=1.0) as app:
        app.migrate()
        ids = seed(app)
        with TestClient(create_app(app), base_url=BASE) as client:
            token = csrf_of(client.get(f"/jobs/{ids.failed_id}").text)
            holder = write_lock_holder(path)
            # Readers are not held back by a writer (WAL): the pages still show.
            assert client.get("/").status_code == 200
            acted = client.post(
                f"/jobs/{ids.failed_id}/retry", data={"csrf_token": token}, follow_redirects=False
            )
            assert acted.status_code == 503
            assert "The store cannot be reached" in acted.text
            assert f"SQLite database {path}" in acted.text and "locked" in acted.text
            assert "Nothing was done" in acted.text and "retries every" in acted.text
            assert app.get(ids.failed_id).state == JobState.FAILED
            holder.kill()
            holder.wait()
            deadline = time.monotonic() + 30
            while True:
                again = client.post(
                    f"/jobs/{ids.failed_id}/retry",
                    data={"csrf_token": token},
                    follow_redirects=False,
                )
                if again.status_code == 303:
                    break
                assert again.status_code == 503 and time.monotonic() < deadline
                time.sleep(0.2)
        assert app.get(ids.failed_id).state == JobState.QUEUED


def test_the_command_started_while_postgres_is_down_serves_503_then_the_pages() -> None:
    import httpx2

    from dashboard_server import free_port

    server = PgServer()
    server.start()
    proc: subprocess.Popen[str] | None = None
    try:
        dsn = server.dsn.replace("://postgres@", "://postgres:s3cret-pw@")
        with App(dsn) as app:
            app.migrate()
            app.enqueue("t", [], queue="served")
        server.halt()
        port = free_port()
        code = "from conveyor.web.commands import dashboard; dashboard()"
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "--port", str(port), "--dsn", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"

        def get(path: str) -> Any:
            deadline = time.monotonic() + 60
            while True:
                try:
                    return httpx2.get(base + path, timeout=15)
                except httpx2.TransportError:
                    assert proc is not None and proc.poll() is None, proc.communicate()[0]
                    assert time.monotonic() < deadline, "the dashboard did not start"
                    time.sleep(0.2)

        down = get("/jobs")
        assert down.status_code == 503 and "The store cannot be reached" in down.text
        redacted = f"postgresql://postgres:***@127.0.0.1:{server.port}/"
        assert redacted in down.text and "s3cret" not in down.text
        assert "conveyor_up 0" in get("/metrics").text
        assert get("/healthz").status_code == 503
        server.start()
        deadline = time.monotonic() + 60
        while (page := get("/")).status_code != 200:
            assert time.monotonic() < deadline, page.text[:300]
            time.sleep(0.5)
        assert ">served</a>" in page.text
        assert "conveyor_up 1" in get("/metrics").text
    finally:
        if proc is not None:
            proc.terminate()
            try:
                output = proc.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:  # never left running, nor its pipe open
                proc.kill()
                output = proc.communicate()[0]
            assert "serving, and trying again" in output and "s3cret" not in output
        server.stop()
