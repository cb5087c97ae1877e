"""The dashboard's views and actions for operators, over HTTP (Starlette's TestClient).

Scheduled and retrying jobs, bulk actions on ticked jobs and on every job
matching a filter (with the count first), a group's page, workers with their
jobs, periodic tasks, deleting a queue, purging with a count first, the live
fragments, a database without conveyor's tables, and odd data and odd query
strings, which must never give a 500.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, JobState
from conveyor.job import utcnow
from conveyor.store.dsn import sqlite_path
from conveyor.store.records import Finish, Lease
from conveyor.web import create_app
from conveyor.web.commands import dashboard
from outcomes import Failure, record_tick
from store_fixtures import sql_only

BASE = "http://127.0.0.1"
LEASE = timedelta(seconds=30)


@pytest.fixture
def client(app: App) -> Iterator[TestClient]:
    with TestClient(create_app(app), base_url=BASE) as test_client:
        yield test_client


def csrf_of(client: TestClient, path: str = "/") -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match, f"no form token on {path}"
    return match.group(1)


def post(client: TestClient, path: str, form: Any) -> Any:
    return client.post(path, data=form, follow_redirects=False)


def job_ids(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'<a href="/jobs/(\d+)">', html)]


def failed(app: App, queue: str, error: str, n: int = 1) -> list[int]:
    ids = [app.enqueue("t", [i], queue=queue, max_attempts=1).id for i in range(n)]
    now = utcnow()
    for job in app.store.job_claim([queue], n, "w", LEASE, now):
        app.store.job_finish([Failure(job.id, job.lease_token or "", error, now)], now)
    return ids


def retrying(app: App, queue: str = "billing") -> int:
    job = app.enqueue("charge", [1], queue=queue, max_attempts=3)
    now = utcnow()
    (held,) = app.store.job_claim([queue], 1, "w", LEASE, now)
    error = "Traceback (most recent call last):\nTimeoutError: partner slow"
    app.store.job_finish(
        [Failure(held.id, held.lease_token or "", error, now + timedelta(hours=1))], now
    )
    return job.id


# --- every state visible ------------------------------------------------------------------


def test_scheduled_and_retrying_are_shown_apart_with_run_now(app: App, client: TestClient) -> None:
    again = retrying(app)
    ready = app.enqueue("t", [], queue="billing").id
    later = app.enqueue("t", [], queue="billing", delay=3600).id
    overview = client.get("/").text
    for state in ("ready", "scheduled", "retrying"):
        assert f'href="/jobs?queue=billing&amp;state={state}">1</a>' in overview
    assert job_ids(client.get("/jobs?state=retrying").text) == [again]
    assert job_ids(client.get("/jobs?state=scheduled").text) == [later]
    assert job_ids(client.get("/jobs?state=ready").text) == [ready]
    listing = client.get("/jobs?queue=billing").text
    assert 'class="badge state-retrying">retrying' in listing
    assert "in 59 min" in listing or "in 1 h<" in listing  # to the second: 59:59.6 is 1 h

    page = client.get(f"/jobs/{again}").text
    assert "Attempt 1 failed; the next one runs" in page and "UTC" in page
    assert "Error of an earlier attempt" in page
    token = csrf_of(client, f"/jobs/{again}")
    response = post(client, f"/jobs/{again}/run-now", {"csrf_token": token})
    assert response.headers["location"] == f"/jobs/{again}?notice=run_now"
    assert app.get(again).detailed_state() == "ready"
    assert post(client, f"/jobs/{again}/run-now", {"csrf_token": token}).status_code == 409


# --- bulk actions -------------------------------------------------------------------------------


def test_ticked_jobs_are_retried_cancelled_or_deleted(app: App, client: TestClient) -> None:
    ids = failed(app, "mail", "ValueError: refused", 3)
    token = csrf_of(client, "/jobs")
    form = {"csrf_token": token, "action": "retry", "id": ids[:2], "state": "failed"}
    response = post(client, "/jobs/bulk", form)
    assert response.headers["location"] == "/jobs?state=failed&notice=bulk_retry&n=2"
    assert "Jobs queued again: 2." in client.get(response.headers["location"]).text
    assert [app.get(i).state for i in ids] == [JobState.QUEUED] * 2 + [JobState.FAILED]
    response = post(client, "/jobs/bulk", {"csrf_token": token, "action": "delete", "id": ids})
    assert response.headers["location"].endswith("notice=bulk_delete&n=3")
    assert app.jobs() == []
    nothing = post(client, "/jobs/bulk", {"csrf_token": token, "action": "cancel"})
    assert nothing.headers["location"].endswith("notice=none_selected")
    assert post(client, "/jobs/bulk", {"csrf_token": "x", "action": "delete"}).status_code == 403
    odd = post(client, "/jobs/bulk", {"csrf_token": token, "action": "explode", "id": "1"})
    assert odd.status_code == 400


def test_every_matching_job_with_a_count_before_confirming(app: App, client: TestClient) -> None:
    timeouts = failed(app, "mail", "TimeoutError: relay slow", 3)
    failed(app, "mail", "ValueError: refused", 2)
    listing = client.get("/jobs?state=failed&error=timeout").text
    assert "/jobs/confirm?state=failed&amp;error=timeout&amp;action=retry" in listing
    confirm = client.get("/jobs/confirm?action=retry&state=failed&error=timeout")
    assert confirm.status_code == 200
    assert re.search(
        r'id="confirm-count"><strong>3</strong> of them will be queued again', confirm.text
    )
    assert app.count_jobs(state="failed") == {"failed": 5}  # asking changed nothing
    token = csrf_of(client, "/jobs")
    form = {"csrf_token": token, "action": "retry", "state": "failed", "error": "timeout"}
    response = post(client, "/jobs/bulk-matching", form)
    assert response.headers["location"] == (
        "/jobs?state=failed&error=timeout&notice=bulk_retry&n=3"
    )
    assert sorted(j.id for j in app.jobs(state="ready")) == timeouts
    # Every job, without a filter: refused, on the confirmation page and in the POST.
    assert client.get("/jobs/confirm?action=delete").status_code == 400
    bare = post(client, "/jobs/bulk-matching", {"csrf_token": token, "action": "delete"})
    assert bare.status_code == 400 and len(app.jobs()) == 5


# --- groups, workers, periodic tasks --------------------------------------------------------------


def test_a_groups_page_counts_cancels_and_takes_back(app: App, client: TestClient) -> None:
    ids = [app.enqueue("reply", [n], queue="chat", group="s 42/a").id for n in range(3)]
    (held,) = app.store.job_claim(["chat"], 1, "consumer-a", LEASE, utcnow())
    page = client.get("/jobs?group=s+42%2Fa").text
    assert job_ids(page) == ids[::-1]
    assert 'class="badge state-ready">ready</span> 2' in page
    assert "Cancel its 2 pending job(s)…" in page and "Take back its running job…" in page
    confirm = client.get("/jobs/confirm?action=cancel&group=s+42%2Fa&state=queued").text
    assert "<strong>2</strong> of them will be cancelled" in confirm
    token = csrf_of(client, "/jobs")
    form = {"csrf_token": token, "action": "cancel", "group": "s 42/a", "state": "queued"}
    assert post(client, "/jobs/bulk-matching", form).headers["location"].endswith("n=2")
    form = {"csrf_token": token, "action": "take_back", "group": "s 42/a", "state": "running"}
    assert post(client, "/jobs/bulk-matching", form).headers["location"].endswith("n=1")
    assert app.get(held.id).state == JobState.QUEUED
    assert app.count_jobs(group="s 42/a") == {"ready": 1, "cancelled": 2}


def test_workers_page_shows_their_jobs_and_a_silent_one_as_probably_dead(
    app: App, client: TestClient
) -> None:
    for n in range(3):
        app.enqueue("render", [n], queue="reports")
    now = utcnow()
    app.store.worker_register("alive-1", "host-a", 11, ["reports"], 4, now)
    # Silent for 45 s: probably dead (over 30 s), still listed (under a minute).
    app.store.worker_register("dead-1", "host-b", 22, ["reports"], 4, now - timedelta(seconds=45))
    app.store.worker_beat("dead-1", 1, now - timedelta(seconds=45))
    (a,) = app.store.job_claim(["reports"], 1, "alive-1", LEASE, now)
    (d,) = app.store.job_claim(["reports"], 1, "dead-1", LEASE, now)
    (o,) = app.store.job_claim(["reports"], 1, "forgotten-9", LEASE, now)
    app.store.job_progress(Lease(a.id, a.lease_token or ""), 0.25, "page 1", now)
    page = client.get("/workers").text
    # Listed oldest first: the silent one started earlier.
    dead, alive = page.split('<h2 class="mono">alive-1</h2>')
    assert (
        f'<a href="/jobs/{a.id}">' in alive and "page 1" in alive and "probably dead" not in alive
    )
    assert f'<a href="/jobs/{d.id}">' in dead and "probably dead" in dead
    assert "Take back its 1 job(s)" in dead
    assert "Running jobs of workers no longer listed" in page and f'<a href="/jobs/{o.id}">' in page
    token = csrf_of(client, "/workers")
    response = post(client, "/workers/take-back", {"csrf_token": token, "worker": "dead-1"})
    assert response.headers["location"] == "/workers?notice=bulk_take_back&n=1"
    assert app.get(d.id).state == JobState.QUEUED and app.get(a.id).state == JobState.RUNNING
    overview = client.get("/").text
    assert "probably dead" in overview


def test_periodic_tasks_with_last_and_next_tick(app: App, client: TestClient) -> None:
    @app.periodic(every=timedelta(minutes=5))
    def refresh_cache() -> None: ...

    @app.periodic(cron="0 3 * * *")
    def nightly_report() -> None: ...

    tick = datetime(2026, 11, 22, 10, 5, tzinfo=UTC)
    record_tick(app.store, "refresh_cache", tick)
    record_tick(app.store, "retired_task", tick)  # ticked once, no longer registered
    page = client.get("/periodic").text
    rows = {
        m[0]: m[1] for m in re.findall(r'<td class="mono title">([^<]+)</td>(.*?)</tr>', page, re.S)
    }
    assert (
        "every 5 min" in rows["refresh_cache"]
        and "2026-11-22 10:05:00 UTC" in rows["refresh_cache"]
    )
    assert "cron 0 3 * * * (UTC)" in rows["nightly_report"] and "none yet" in rows["nightly_report"]
    assert " 03:00:00 UTC" in rows["nightly_report"]
    assert "2026-11-22 10:05:00 UTC" in rows["retired_task"]
    bare = App(store=app.store)  # a dashboard without the application's code
    with TestClient(create_app(bare), base_url=BASE) as other:
        assert "conveyor dashboard --app myapp.tasks:app" in other.get("/periodic").text


# --- queues and purges ----------------------------------------------------------------------------


def test_delete_a_queue_after_seeing_what_it_holds(app: App, client: TestClient) -> None:
    failed(app, "team/old", "x", 2)
    app.enqueue("t", [], queue="team/old")
    page = client.get("/queues/team%2Fold/delete").text
    assert "It holds 3 job(s)" in page and "Delete the queue and its 3 job(s)" in page
    token = csrf_of(client)
    response = post(client, "/queues/team%2Fold/delete", {"csrf_token": token})
    assert response.headers["location"] == "/?notice=queue_deleted&n=3&queue=team%2Fold"
    assert "team/old" not in app.store.queue_names()
    assert client.get("/queues/team%2Fold/delete").status_code == 404


def test_purge_shows_the_count_before_deleting(app: App, client: TestClient) -> None:
    failed(app, "mail", "x", 2)
    failed(app, "sms", "x", 1)
    app.enqueue("t", [], queue="mail")
    (held,) = app.store.job_claim(["mail"], 1, "w", LEASE, utcnow())
    app.store.job_finish([Finish.complete(held.id, held.lease_token or "", None)], utcnow())
    page = client.get("/purge?older_than=0s&state=failed&queue=mail")
    assert page.status_code == 200
    assert re.search(r'id="purge-count"><strong>2</strong> failed job', page.text)
    assert app.count_jobs(state="failed") == {"failed": 3}
    token = csrf_of(client)
    form = {"csrf_token": token, "older_than": "0s", "state": "failed", "queue": "mail"}
    assert post(client, "/purge", form).headers["location"] == "/?notice=purged&n=2"
    assert app.count_jobs() == {"succeeded": 1, "failed": 1}
    assert client.get("/purge?older_than=1y").status_code == 400
    assert client.get("/purge?older_than=1h&state=running").status_code == 400


# --- live fragments -------------------------------------------------------------------------------


def test_live_parts_of_each_page(app: App, client: TestClient) -> None:
    job = app.enqueue("t", [], queue="q").id
    live = {"X-Conveyor-Live": "1"}
    for path, marker in (
        ("/", 'data-src="/live"'),
        ("/jobs?queue=q", 'data-src="/jobs?queue=q"'),
        (f"/jobs/{job}", f'data-src="/jobs/{job}"'),
        ("/workers", 'data-src="/workers"'),
        ("/periodic", 'data-src="/periodic"'),
    ):
        page = client.get(path).text
        assert marker in page and "data-live" in page, path
        part = client.get(path, headers=live)
        assert part.status_code == 200 and "<html" not in part.text, path
    assert job_ids(client.get("/jobs?queue=q", headers=live).text) == [job]
    assert f"Job {job}" in client.get(f"/jobs/{job}", headers=live).text


# --- a database without conveyor's tables ------------------------------------------------------


def test_every_page_says_run_conveyor_migrate(pg_clean_dsn: str) -> None:
    with App(pg_clean_dsn) as app, TestClient(create_app(app), base_url=BASE) as client:
        for path in ("/", "/jobs", "/jobs?state=failed", "/jobs/1", "/workers", "/periodic"):
            page = client.get(path)
            assert page.status_code == 503, path
            assert "run `conveyor migrate`" in page.text, path
        assert client.get("/metrics").status_code == 503
        health = client.get("/healthz")
        assert health.status_code == 503 and health.json()["ok"] is False
        assert "conveyor migrate" in health.json()["error"]
        app.migrate()
        assert client.get("/").status_code == 200 and client.get("/healthz").json()["ok"]


@sql_only  # Redis has no tables to drop
def test_a_schema_dropped_while_the_dashboard_runs_asks_for_migrate(dsn: str) -> None:
    with App(dsn) as app, TestClient(create_app(app), base_url=BASE) as client:
        app.migrate()
        assert client.get("/jobs").status_code == 200
        # Dropped by hand under a running dashboard: the store says SchemaMissingError.
        if dsn.startswith("sqlite"):
            conn = sqlite3.connect(sqlite_path(dsn))
            conn.execute("DROP TABLE jobs")
            conn.commit()
            conn.close()
        else:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DROP TABLE jobs CASCADE")
        page = client.get("/jobs")
        assert page.status_code == 503 and "conveyor migrate" in page.text


def test_the_command_refuses_a_sqlite_file_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    result = CliRunner().invoke(dashboard, ["--dsn", f"sqlite:///{missing}"])
    assert result.exit_code == 1
    assert f"no database at {missing}" in result.output
    assert not missing.exists()


# --- odd data and odd query strings: a page or a 4xx, never a 500 --------------------------------


def test_odd_stored_data_and_odd_query_strings_never_give_a_500(
    app: App, client: TestClient
) -> None:
    store = app.store
    odd_names = ["<b>bold</b>", "ünïcødé ☃", "with space", "slash/and%25percent", "x" * 200]
    for name in odd_names:
        app.enqueue(name, [name], {"k": name}, queue=name, group=name, batch=name, key=name)
    blank = app.enqueue("blank", [], queue="odd", max_attempts=1)
    huge = app.enqueue("huge", [], queue="odd", max_attempts=1)
    spaces = app.enqueue("spaces", [], queue="odd", max_attempts=1)
    progress = app.enqueue("progress", [], queue="odd2")
    now = utcnow()  # after the enqueues: their run_at must not lie in the future
    for job in store.job_claim(["odd"], 3, "w", LEASE, now):
        error = {blank.id: "", huge.id: "E" * 2_000_000 + "\nValueError: huge", spaces.id: " \n \n"}
        store.job_finish([Failure(job.id, job.lease_token or "", error[job.id], now)], now)
    (held,) = store.job_claim(["odd2"], 1, "w\x7f<odd>", LEASE, now)
    store.job_progress(Lease(held.id, held.lease_token or ""), float("nan"), "x" * 10_000, now)
    store.worker_register("w\x7f<odd>", "<host>", 1, ["<b>bold</b>", ""], 0, now)
    assert progress.id

    paths = [
        "/",
        "/jobs",
        "/jobs?state=failed",
        f"/jobs/{blank.id}",
        f"/jobs/{huge.id}",
        f"/jobs/{spaces.id}",
        f"/jobs/{held.id}",
        "/workers",
        "/periodic",
        "/metrics",
        *(f"/jobs?queue={n}" for n in odd_names),
        *(f"/jobs?group={n}&state=queued" for n in odd_names),
        "/jobs?before=²",
        "/jobs?before=-1",
        "/jobs?before=99999999999999999999999",
        "/jobs/99999999999999999999999",
        "/jobs/0",
        "/jobs?state=bogus",
        "/jobs?state=",
        "/jobs?queue=%00",
        "/jobs?task=%FF%FE",
        "/jobs?error=" + "e" * 5000,
        "/jobs?error=%00",
        "/jobs?group=" + "g" * 300,
        "/jobs?queue=a&queue=b&state=failed&state=ready",
        "/jobs/confirm",
        "/jobs/confirm?action=retry",
        "/jobs/confirm?action=retry&queue=%00",
        "/jobs/confirm?action=nope&queue=odd",
        "/?notice=purged&n=²",
        "/?notice=%00",
        "/purge",
        "/purge?older_than=0s&queue=%00",
        "/queues/%00/delete",
        "/queues/nosuch/delete",
        "/workers?x=%FF",
    ]
    for path in paths:
        response = client.get(path)
        assert response.status_code < 500, (path, response.status_code)
    assert client.get("/jobs?before=²").status_code == 400
    assert client.get("/jobs/99999999999999999999999").status_code == 404
    listing = client.get("/jobs?queue=odd").text
    assert job_ids(listing) == [spaces.id, huge.id, blank.id]
    assert "E" * 119 + "…" in listing  # the first line, cut: not two megabytes in a list
    assert "ValueError: huge" in client.get(f"/jobs/{huge.id}").text
    assert "&lt;b&gt;bold&lt;/b&gt;" in client.get("/").text

    token = csrf_of(client)
    for path, form in (
        (f"/jobs/{blank.id}/explode", {}),
        ("/jobs/99999999999999999999999/retry", {}),
        (f"/jobs/{held.id}/delete", {}),
        ("/jobs/bulk", {"action": "retry", "id": ["²", "-4", "99999999999999999999999"]}),
        ("/jobs/bulk-matching", {"action": "cancel", "queue": "\x00"}),
        ("/jobs/bulk-matching", {"action": "cancel", "error": "e" * 500}),
        ("/workers/take-back", {}),
        ("/purge", {"older_than": "0s", "state": "queued"}),
        ("/purge", {"older_than": "1y"}),
        ("/queues/%00/pause", {}),
        ("/queues/odd2/delete", {}),  # a running job
    ):
        response = post(client, path, {"csrf_token": token, **form})
        assert response.status_code < 500, (path, response.status_code)
        assert response.status_code != 303 or path == "/jobs/bulk", (path, response.status_code)
