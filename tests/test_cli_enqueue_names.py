"""``conveyor enqueue`` refuses a task name nobody knows (a typo), naming the close ones.

Known: the tasks of the App given with --app, or else the tasks the database has
seen (its newest jobs and periodic tasks). --any-task enqueues any name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from conveyor import App
from conveyor.cli import cli
from conveyor.job import utcnow
from outcomes import record_tick


def run(*args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == code, (result.stdout, result.stderr)
    return result


def said(result: Result) -> str:
    return " ".join(result.stderr.split())


def test_a_name_the_database_has_not_seen_is_refused_with_the_near_ones(app: App, dsn: str) -> None:
    app.enqueue("send_mail", ["ada@example.com"], queue="mail")
    app.enqueue("send_sms", ["+33"], queue="sms")
    record_tick(app.store, "nightly_report", utcnow())
    refused = run("enqueue", "sned_mail", "--queue", "mail", "--dsn", dsn, code=2)
    assert "no task 'sned_mail' is known here: did you mean send_mail?" in said(refused)
    assert "--any-task" in said(refused) and "Traceback" not in refused.output
    assert "sned_mail" not in {j.task for j in app.jobs()}  # nothing enqueued
    # Known: a task of a job in the database, and a periodic task.
    assert "enqueued job" in run("enqueue", "send_sms", "--queue", "sms", "--dsn", dsn).stdout
    assert "enqueued job" in run("enqueue", "nightly_report", "--dsn", dsn).stdout
    # Told otherwise: any name.
    forced = run("enqueue", "brand_new_task", "--any-task", "--dsn", dsn)
    assert "enqueued job" in forced.stdout
    assert app.jobs(limit=1)[0].task == "brand_new_task"


def test_an_empty_database_knows_no_task(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'fresh.db'}"
    refused = run("enqueue", "send_mail", "--dsn", dsn, code=2)
    assert "no task is known yet" in said(refused) and "--app MODULE:APP" in said(refused)
    assert not (tmp_path / "fresh.db").exists()  # not created to say so


def test_with_an_app_its_tasks_are_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONVEYOR_DSN", raising=False)
    dsn = f"sqlite:///{tmp_path / 'a.db'}"
    app_option = ["--app", "conveyor.cli.demo_tasks:app", "--dsn", dsn]
    refused = run("enqueue", "thumbnal", "--args", "[1]", *app_option, code=2)
    assert "has no task 'thumbnal': did you mean thumbnail?" in said(refused)
    assert "enqueued job" in run("enqueue", "thumbnail", "--args", "[1]", *app_option).stdout
    forced = run("enqueue", "elsewhere", "--any-task", "--queue", "x", *app_option)
    assert "enqueued job" in forced.stdout
