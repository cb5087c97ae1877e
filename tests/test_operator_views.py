"""Every field of a job, seen and searched from the dashboard and the command line.

Key, limit key, group and batch on the job page and in ``conveyor jobs show``;
filters by key, limit key and text in the arguments on both; how many jobs a
list matches; progress shown while a job runs and kept in its history after.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from conveyor import App
from conveyor.cli import cli
from conveyor.job import utcnow
from conveyor.store.records import Finish, Lease
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def run(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "160"})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def fill(app: App) -> dict[str, int]:
    ids = {}
    ids["ada"] = app.enqueue(
        "mail.send", ["ada@example.com"], queue="mail", key="welcome-ada", group="u-1",
        batch="b-9",
    ).id  # fmt: skip
    ids["c42"] = app.enqueue(
        "api.call", [1], {"customer": "c-42"}, queue="api", limit_key="c-42"
    ).id
    ids["c7"] = app.enqueue("api.call", [2], {"customer": "c-7"}, queue="api", limit_key="c-7").id
    for n in range(3):
        app.enqueue("bulk.item", [n], queue="bulk")
    return ids


def test_the_dashboard_shows_and_filters_every_field(app: App) -> None:
    ids = fill(app)
    with TestClient(create_app(app), base_url=BASE) as client:
        page = client.get(f"/jobs/{ids['c42']}").text
        assert 'href="/jobs?queue=api&amp;limit_key=c-42"' in page and ">c-42</a>" in page
        ada = client.get(f"/jobs/{ids['ada']}").text
        for label, value in (("Key", "welcome-ada"), ("Group", "u-1"), ("Batch", "b-9")):
            assert re.search(rf"<dt>{label}</dt><dd><a class=\"mono\"[^>]*>{value}</a>", ada)
        assert "<dt>Limit key</dt>" in ada  # shown, empty, for a job without one

        by_limit_key = client.get("/jobs?limit_key=c-42").text
        assert f'<a href="/jobs/{ids["c42"]}">' in by_limit_key
        assert f'<a href="/jobs/{ids["c7"]}">' not in by_limit_key
        assert re.search(r"<strong>1</strong> job matches these filters; showing 1", by_limit_key)
        by_key = client.get("/jobs?key=welcome-ada").text
        assert f'<a href="/jobs/{ids["ada"]}">' in by_key
        by_args = client.get("/jobs?args=C-7").text
        assert f'<a href="/jobs/{ids["c7"]}">' in by_args and "newest 100,000 jobs" in by_args
        everything = client.get("/jobs").text
        assert re.search(r"<strong>6</strong> jobs match; showing 6", everything)
        queue = client.get("/jobs?queue=bulk&state=ready").text
        assert re.search(r"<strong>3</strong> jobs match these filters", queue)
        assert 'name="limit_key"' in everything and 'name="args"' in everything
        assert client.get("/jobs?args=" + "x" * 300).status_code == 400


def test_the_command_line_shows_and_filters_every_field(app: App, dsn: str) -> None:
    ids = fill(app)
    shown = run("jobs", "show", str(ids["c42"]), "--dsn", dsn).stdout
    assert re.search(r"limit_key\s+c-42", shown) and re.search(r"key\s+-", shown)
    shown = run("jobs", "show", str(ids["ada"]), "--dsn", dsn).stdout
    for name, value in (("key", "welcome-ada"), ("group", "u-1"), ("batch", "b-9")):
        assert re.search(rf"^{name}\s+{value}\s*$", shown, re.MULTILINE), name
    listed = run("jobs", "list", "--limit-key", "c-42", "--dsn", dsn).stdout
    assert re.search(rf"^\s*{ids['c42']}\s", listed, re.MULTILINE)
    assert not re.search(rf"^\s*{ids['c7']}\s", listed, re.MULTILINE)
    assert "1 job matches; showing 1" in listed
    assert "1 job matches" in run("jobs", "list", "--key", "welcome-ada", "--dsn", dsn).stdout
    found = run("jobs", "list", "--args", "c-7", "--json", "--dsn", dsn)
    assert [job["id"] for job in json.loads(found.stdout)] == [ids["c7"]]
    paged = run("jobs", "list", "--queue", "bulk", "--limit", "2", "--dsn", dsn).stdout
    assert "3 jobs match; showing 2" in paged and "more: --before" in paged
    counted = run("jobs", "count", "--limit-key", "c-7", "--json", "--dsn", dsn).stdout
    assert '"ready": 1' in counted


def test_progress_shows_while_running_and_stays_in_the_history(app: App, dsn: str) -> None:
    job = app.enqueue("report.build", [1], queue="reports")
    now = utcnow()
    (held,) = app.store.job_claim(["reports"], 1, "w-1", timedelta(seconds=30), now)
    app.store.job_progress(Lease(held.id, held.lease_token or ""), 0.6, "page 6 of 10", now)
    with TestClient(create_app(app), base_url=BASE) as client:
        running = client.get(f"/jobs/{job.id}").text
        assert 'id="job-progress"' in running and "60 %" in running
        assert "page 6 of 10" in client.get("/jobs?queue=reports").text
        shown = run("jobs", "show", str(job.id), "--dsn", dsn).stdout
        assert re.search(r"^progress\s+0\.6\s*$", shown, re.MULTILINE)

        app.store.job_finish([Finish.complete(held.id, held.lease_token or "", None)], utcnow())
        done = client.get(f"/jobs/{job.id}").text
        assert 'id="job-progress"' not in done
        assert "Last progress reported while it ran: 60 % page 6 of 10" in done
        assert "page 6 of 10" not in client.get("/jobs?queue=reports").text
    shown = run("jobs", "show", str(job.id), "--dsn", dsn).stdout
    assert not re.search(r"^progress", shown, re.MULTILINE)
    assert "last progress reported while it ran: 60 % page 6 of 10" in shown


def test_a_count_that_reads_the_jobs_is_kept_between_refreshes(app: App) -> None:
    fill(app)
    with TestClient(create_app(app), base_url=BASE) as client:
        live = {"X-Conveyor-Live": "1"}
        assert "<strong>2</strong> jobs match" in client.get("/jobs?task=api.call").text
        assert "<strong>3</strong> jobs match" in client.get("/jobs?queue=bulk").text
        app.enqueue("api.call", [9], queue="api")
        app.enqueue("bulk.item", [9], queue="bulk")
        # By task the jobs are read: the count is kept (30 s), the list itself is fresh.
        kept = client.get("/jobs?task=api.call", headers=live).text
        assert "<strong>2</strong> jobs match" in kept and kept.count('<a href="/jobs/') == 3
        # By queue the overview's counts answer: always fresh.
        assert "<strong>4</strong> jobs match" in client.get("/jobs?queue=bulk", headers=live).text
