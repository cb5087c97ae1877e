"""A new user's first steps work as printed: the demo's closing commands, the docs build."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conveyor import App
from conveyor.cli.demo import next_steps, program

ROOT = Path(__file__).resolve().parent.parent
#: The PATH of a new shell: none of this environment's scripts on it.
NEW_SHELL_PATH = "/usr/bin:/bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def printed_commands(text: str) -> dict[str, str]:
    """The demo's closing lines, ``Label:   command``, as label -> command."""
    found = {}
    for line in text.strip().splitlines():
        label, _, rest = line.partition(":")
        found[label.strip()] = rest.strip()
    return found


def test_the_printed_program_runs_in_a_new_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    # A new shell after `make demo`: the environment's scripts are not on its PATH.
    monkeypatch.setenv("PATH", NEW_SHELL_PATH)
    run = program()
    assert run != "conveyor"
    result = subprocess.run(
        ["bash", "-c", f"{run} --help"], env={**os.environ}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "demo" in result.stdout


def test_the_program_is_a_word_when_the_path_finds_this_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{NEW_SHELL_PATH}")
    assert program() == "conveyor"


def test_every_command_the_demo_prints_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = "sqlite:///conveyor-demo.db"  # as the demo prints it: relative to where it ran
    with App(f"sqlite:///{tmp_path / 'conveyor-demo.db'}") as app:
        app.migrate()
        app.enqueue("fetch_rates", [1], queue="partners")
    monkeypatch.chdir(tmp_path)  # the demo runs where the user is
    monkeypatch.setenv("PATH", NEW_SHELL_PATH)
    monkeypatch.delenv("CONVEYOR_DSN", raising=False)
    steps = printed_commands(next_steps(dsn, Path("conveyor-demo.db.workers.log")))
    env = {**os.environ}
    for label in (
        "Every state, per queue",
        "Waiting out a backoff",
        "Due later",
        "Failed for good",
    ):
        command = steps[label]
        result = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"{command}: {result.stderr}"
    assert "partners" in subprocess.run(
        ["bash", "-c", steps["Every state, per queue"]], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip

    # The dashboard's line: the command, then the page it names (on a free port here).
    dashboard = steps["Open the dashboard"]
    shown = re.fullmatch(r"(.*?)\s+\(then (http://\S+)\)", dashboard)
    assert shown is not None, dashboard
    command, page = shown.groups()
    port = free_port()
    server = subprocess.Popen(
        ["bash", "-c", f"exec {command} --port {port}"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        url = page.replace(":8080", f":{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    body = response.read().decode()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the dashboard did not answer"
                time.sleep(0.2)
        assert response.status == 200 and "retrying" in body
    finally:
        server.terminate()
        server.communicate(timeout=15)


@pytest.mark.slow
def test_make_docs_builds_a_site_that_works_opened_from_disk() -> None:
    started = time.monotonic()
    result = subprocess.run(
        ["make", "--no-print-directory", "docs"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert time.monotonic() - started < 120
    index = (ROOT / "site" / "index.html").read_text()
    # Links name pages, not folders: a browser on file:// shows the page, not a listing.
    assert 'href="getting-started.html"' in index
    assert 'href="getting-started/"' not in index
    assert (ROOT / "site" / "getting-started.html").exists()


@pytest.mark.slow
def test_make_docs_serve_serves_the_site() -> None:
    port = free_port()
    server = subprocess.Popen(
        ["make", "--no-print-directory", "docs-serve", f"DOCS_ADDR=127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    body = answer.read().decode()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "make docs-serve did not serve"
                time.sleep(0.5)
        assert "getting-started.html" in body
    finally:
        # make and the mkdocs it started: the session this test made for them. SIGTERM,
        # not SIGINT: a suite started in the background runs with SIGINT ignored, and
        # its children keep that across exec.
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate(timeout=30)
            raise


def test_the_demo_and_docs_targets_install_what_they_need() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -q -e '.[cli,web]'" in makefile  # the dashboard the demo points to
    assert "pip install -q -e '.[docs]'" in makefile  # the docs extra alone
