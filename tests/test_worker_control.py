"""Worker control: an operator quiets, resumes, resizes or stops a worker through the
store (any machine), and the worker obeys at its next check-in; on every store."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from conveyor import App, ConfigurationError
from conveyor.cli import cli
from conveyor.job import utcnow
from conveyor.store.protocols import Store

#: A short lease: the worker checks in (and reads what was asked) every third of it.
LEASE = 0.6


def until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def registered(app: App, worker_id: str) -> None:
    until(lambda: any(s.info.id == worker_id for s in app.workers()), "the worker to register")


def test_the_store_merges_what_is_asked_and_the_check_in_returns_it(store: Store) -> None:
    now = utcnow()
    store.worker_register("w-1", "host-a", 1, ["q"], 4, now)
    assert store.worker_beat("w-1", 0, now) is None
    asked = store.worker_control("w-1", json.dumps({"quiet": True}))
    assert asked is not None and json.loads(asked) == {"quiet": True}
    store.worker_control("w-1", json.dumps({"concurrency": 2}))
    assert json.loads(store.worker_beat("w-1", 0, now) or "{}") == {"quiet": True, "concurrency": 2}
    store.worker_control("w-1", json.dumps({"quiet": None}))  # null drops a request
    assert json.loads(store.worker_beat("w-1", 0, now) or "{}") == {"concurrency": 2}
    (listed,) = store.worker_list()
    assert listed.control == {"concurrency": 2}
    assert store.worker_control("nobody", json.dumps({"stop": True})) is None
    assert store.worker_beat("nobody", 0, now) is None


def test_bad_requests_are_refused_with_what_is_wrong(app: App) -> None:
    with pytest.raises(ConfigurationError, match="no worker 'ghost' is registered"):
        app.control_worker("ghost", quiet=True)
    with pytest.raises(ConfigurationError, match="concurrency must be a whole number"):
        app.control_worker("ghost", concurrency=0)
    with pytest.raises(ConfigurationError, match="ask something"):
        app.control_worker("ghost")


def test_a_quiet_worker_claims_nothing_new_then_resumes(app: App) -> None:
    done: list[str] = []

    @app.task(queue="ctl")
    def note(text: str) -> None:
        done.append(text)

    with app.worker(queues=["ctl"], lease=LEASE, poll_interval=0.1) as worker:
        registered(app, worker.id)
        app.control_worker(worker.id, quiet=True)
        until(lambda: worker.quiet, "the worker to go quiet")
        job = note.enqueue("while quiet")
        time.sleep(4 * LEASE)  # how long we watch: a quiet worker claims nothing
        assert app.get(job.id).state == "queued" and done == []
        assert [s.quiet for s in app.workers()] == [True]
        app.control_worker(worker.id, quiet=False)
        assert app.wait(job.id, timeout=15) is None
    assert done == ["while quiet"]


def test_concurrency_changes_the_slots_of_a_running_worker(app: App) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    @app.task(queue="ctl")
    def slow() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.15)
        with lock:
            running -= 1

    with app.worker(queues=["ctl"], concurrency=4, lease=LEASE, poll_interval=0.1) as worker:
        registered(app, worker.id)
        app.control_worker(worker.id, concurrency=1)
        until(lambda: worker.concurrency == 1, "one slot")
        jobs = [slow.enqueue() for _ in range(5)]
        for job in jobs:
            app.wait(job.id, timeout=20)
        assert most == 1
        (status,) = app.workers()
        assert status.concurrency == 1 and status.info.concurrency == 4
        most = 0
        app.control_worker(worker.id, concurrency=3)
        until(lambda: worker.concurrency == 3, "three slots")
        jobs = [slow.enqueue() for _ in range(6)]
        for job in jobs:
            app.wait(job.id, timeout=20)
        assert 1 < most <= 3


def test_stop_drains_the_worker_and_it_leaves_the_list(app: App) -> None:
    @app.task(queue="ctl")
    def nap() -> str:
        time.sleep(0.3)
        return "done"

    worker = app.worker(queues=["ctl"], lease=LEASE, poll_interval=0.1).start()
    try:
        job = nap.enqueue()
        until(lambda: app.get(job.id).state == "running", "the job to start")
        registered(app, worker.id)
        app.control_worker(worker.id, stop=True)
        assert worker.wait_stopped(15)
        assert app.get(job.id).result == "done"  # let finish, not cut
        assert app.workers() == []
    finally:
        worker.stop()


def test_the_cli_lists_asks_and_records_in_the_audit(app: App, dsn: str) -> None:
    now = utcnow()
    app.store.worker_register("w-9", "host-z", 7, ["ctl"], 8, now)
    runner = CliRunner()

    def run(*args: str) -> Any:
        result = runner.invoke(cli, [*args, "--dsn", dsn])
        assert result.exit_code == 0, result.output
        return result.output

    assert "w-9" in run("workers", "list") and "working" in run("workers", "list")
    assert "quiet asked" in run("workers", "quiet", "w-9")
    assert "quiet" in run("workers", "list")
    run("workers", "concurrency", "w-9", "2")
    shown = json.loads(run("workers", "show", "w-9"))
    assert shown["quiet"] is True and shown["concurrency"] == 2
    assert shown["control"] == {"quiet": True, "concurrency": 2}
    run("workers", "resume", "w-9")
    run("workers", "stop", "w-9")
    listed = json.loads(run("workers", "list", "--json"))
    assert listed[0]["control"] == {"concurrency": 2, "stop": True}
    missing = runner.invoke(cli, ["workers", "quiet", "nobody", "--dsn", dsn])
    assert missing.exit_code != 0 and "no worker 'nobody'" in missing.output
    audit = json.loads(run("audit", "--json"))
    assert [entry["action"] for entry in audit][:4] == [
        "worker stop", "worker resume", "worker concurrency 2", "worker quiet",
    ]  # fmt: skip
    assert all(entry["target"] == "w-9" for entry in audit[:4])


def test_the_dashboard_quiets_resizes_and_stops_a_worker(app: App) -> None:
    import re

    from starlette.testclient import TestClient

    from conveyor.web import create_app

    app.store.worker_register("w-7", "host-y", 3, ["ctl"], 8, utcnow())
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get("/workers").text
        assert 'value="quiet"' in page and 'name="slots"' in page
        found = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert found is not None
        token = found.group(1)

        def ask(**form: str) -> Any:
            data = {"csrf_token": token, "worker": "w-7", **form}
            return client.post("/workers/control", data=data, follow_redirects=False)

        assert ask(control="quiet").status_code == 303
        assert ask(control="concurrency", slots="3").status_code == 303
        (status,) = app.workers()
        assert status.quiet and status.concurrency == 3
        shown = client.get("/workers").text
        assert 'state-scheduled">quiet<' in shown and "0 of 3 slots busy (started with 8)" in shown
        assert ask(control="concurrency", slots="lots").status_code == 400
        assert ask(control="dance").status_code == 400
        assert ask(control="stop").status_code == 303
        assert "stopping" in client.get("/workers").text
        audit = client.get("/audit").text
        assert "worker concurrency" in audit and "worker w-7 to 3" in audit
