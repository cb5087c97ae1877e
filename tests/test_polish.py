"""Small things an operator reads: one way of writing durations, messages that say what is wrong."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from conveyor import App
from conveyor.cli import cli
from conveyor.cli.output import age
from conveyor.logs import spelled_duration
from conveyor.web.format import seconds


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (0.0, "0.0 s"),
        (2.14, "2.1 s"),
        (42.4, "42 s"),
        (59.7, "1 min"),
        (185, "3 min 5 s"),
        (600, "10 min"),
        (599.99, "10 min"),
        (3599.2, "59 min 59 s"),
        (7800, "2 h 10 min"),
        (7200, "2 h"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
        (-5, "0.0 s"),
    ],
)
def test_durations_are_written_one_way_everywhere(value: float, written: str) -> None:
    assert spelled_duration(value) == written  # the worker's log
    assert seconds(value) == written  # the dashboard
    assert age(value) == written  # the command line


def test_a_missing_duration_is_a_dash() -> None:
    assert seconds(None) == seconds(math.nan) == "—"
    assert age(None) == age(math.inf) == "-"


def test_a_bulk_action_on_a_queue_that_does_not_exist_says_so(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    with App(dsn) as app:
        app.enqueue("send", [1], queue="mail")
    runner = CliRunner()
    result = runner.invoke(cli, ["--dsn", dsn, "jobs", "cancel", "--queue", "mial", "--yes"])
    assert result.exit_code == 1
    assert "there is no queue 'mial' (queues: mail)" in result.stderr
    # An existing queue with nothing to cancel is not an error.
    result = runner.invoke(
        cli, ["--dsn", dsn, "jobs", "retry", "--queue", "mail", "--state", "failed", "--yes"]
    )
    assert result.exit_code == 0, result.output
    assert "0 job(s) match (none)" in result.output


def test_purge_of_every_age_does_not_say_older_than_zero(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    with App(dsn) as app:
        app.migrate()
    runner = CliRunner()
    result = runner.invoke(cli, ["--dsn", dsn, "purge", "--older-than", "0s", "--yes"])
    assert result.exit_code == 0, result.output
    assert "of any age" in result.output and "0:00:00" not in result.output
    result = runner.invoke(cli, ["--dsn", dsn, "purge", "--older-than", "90m", "--yes"])
    assert "older than 1 h 30 min" in result.output


def test_the_dashboard_writes_counts_with_thousands_separated(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from conveyor.job import NewJob, utcnow
    from conveyor.web import create_app

    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.migrate()
        new = NewJob(queue="mail", task="send", args_json="[]", kwargs_json="{}", run_at=utcnow())
        app.store.job_insert_many([new] * 1234, now=utcnow())
        client = TestClient(create_app(app), base_url="http://127.0.0.1")
        overview = client.get("/").text
        assert ">1,234</a>" in overview and ">1234<" not in overview
        assert "Finished jobs deleted: 12,000." in client.get("/?notice=purged&n=12000").text
        confirm = client.get("/jobs/confirm?action=cancel&queue=mail").text
        assert "1,234" in confirm and "1234" not in confirm


def complete(words: str, env: dict[str, str] | None = None) -> list[str]:
    """What ``conveyor`` answers bash's completion asking about ``words`` (the last is typed)."""
    import os
    import subprocess
    import sys

    parts = words.split(" ")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "conveyor")],
        env={**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1),
             "_CONVEYOR_COMPLETE": "bash_complete", **(env or {})},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return [line.partition(",")[2] for line in result.stdout.splitlines()]


def test_shell_completion_works_as_the_cli_guide_says() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    assert 'eval "$(_CONVEYOR_COMPLETE=bash_source conveyor)"' in guide
    assert complete("conveyor jobs l") == ["list"]
    assert "ready" in complete("conveyor jobs list --state ")


@pytest.mark.parametrize(
    "dsn", ["postgresql://nobody@127.0.0.1:1/jobs", "redis://127.0.0.1:1/0"], ids=["pg", "redis"]
)
def test_a_connection_error_is_written_in_sentences(dsn: str) -> None:
    from conveyor.errors import StoreUnavailableError

    with pytest.raises(StoreUnavailableError) as caught:
        App(dsn).stats()
    text = str(caught.value)
    assert "127.0.0.1:1" in text and text.endswith("Is the server running, and is the DSN right?")
    assert "?." not in text and ".." not in text and ". ." not in text


def test_a_drivers_reason_ends_as_one_sentence() -> None:
    from conveyor.errors import StoreUnavailableError

    said = StoreUnavailableError.saying
    assert (
        str(said("at x", "refused."))
        == "at x: refused. Is the server running, and is the DSN right?"
    )
    assert str(said("at x", "refused..  ")).startswith("at x: refused. Is")
    assert str(said("at x", "accepting connections?")).startswith("at x: accepting connections? Is")


def test_a_queues_notice_names_the_queue_and_only_a_queue_the_store_knows(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from conveyor.web import create_app

    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.enqueue("send", [1], queue="mail")
        client = TestClient(create_app(app), base_url="http://127.0.0.1")
        page = client.get("/")
        token = page.text.split('name="csrf_token" value="')[1].split('"')[0]
        done = client.post(
            "/queues/mail/pause",
            data={"csrf_token": token},
            headers={"origin": "http://127.0.0.1"},
            follow_redirects=False,
        )
        assert done.status_code == 303, done.text
        shown = client.get(done.headers["location"]).text
        assert "Queue mail paused: workers no longer claim its jobs." in shown
        # An address cannot make the page say a name the store does not know.
        forged = client.get("/?notice=paused&queue=call%20555-0100%20now").text
        assert "Queue paused: workers" in forged and "555-0100" not in forged
