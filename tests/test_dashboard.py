"""The dashboard over HTTP (Starlette's TestClient), on a seeded database.

Pages, filters, actions with their CSRF and origin checks, the token, the
host check, the security headers, /metrics and /healthz, and the command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App
from conveyor.job import JobState, utcnow
from conveyor.store.records import Finish
from conveyor.version import __version__
from conveyor.web import create_app
from conveyor.web.commands import dashboard
from conveyor.web.metrics import Metrics
from dashboard_seed import SCRIPT_PAYLOAD, Seeded, seed
from dashboard_server import free_port
from outcomes import Failure

BASE = "http://127.0.0.1"


@pytest.fixture
def seeded(app: App) -> Seeded:
    return seed(app)


@pytest.fixture
def client(app: App, seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(create_app(app), base_url=BASE) as test_client:
        yield test_client


def csrf_of(client: TestClient, path: str = "/") -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match, f"no form token on {path}"
    return match.group(1)


def post(client: TestClient, path: str, **form: str) -> Any:
    return client.post(path, data=form, follow_redirects=False)


# --- pages ------------------------------------------------------------------------------


def test_overview_lists_queues_counts_workers_and_chart(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    for queue in ("mail", "media", "reports", "web"):
        assert f'href="/jobs?queue={queue}">{queue}</a>' in html
    assert 'href="/jobs?queue=reports&amp;state=failed">1</a>' in html
    assert "build-01" in html and "4242" in html and "1 / 4" in html
    # Both successes ended in the same minute: one bar in the hour's chart, one in mail's.
    assert html.count('class="bar bar-succeeded"') == 2
    assert html.count('class="bar bar-failed"') == 2  # the chart's and reports\'
    assert re.search(r'id="live" data-src="[^"]*/live"', html)
    fragment = client.get("/live").text
    assert "<html" not in fragment and "build-01" in fragment


def test_security_headers_forbid_inline_script(client: TestClient) -> None:
    headers = client.get("/").headers
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    # No inline script or handler in any page: the policy would block it.
    for path in ("/", "/jobs", "/jobs?state=failed"):
        html = client.get(path).text
        assert re.search(r"<script(?![^>]*\bsrc=)", html) is None
        assert re.search(r"\son\w+=", html) is None


def test_job_list_filters(client: TestClient, seeded: Seeded) -> None:
    def ids(query: str) -> list[int]:
        html = client.get("/jobs" + query).text
        return [int(n) for n in re.findall(r'<a href="/jobs/(\d+)">', html)]

    assert ids("?state=failed") == [seeded.failed_id]
    assert ids("?state=failed&error=smtp+RELAY") == [seeded.failed_id]
    assert ids("?state=failed&error=disk+full") == []
    assert ids("?queue=reports") == [seeded.running_id, seeded.failed_id]
    assert ids("?task=render.page") == [seeded.script_id]
    assert len(ids("?batch=album-7")) == 1
    assert len(ids("")) == 8
    assert client.get("/jobs?state=bogus").status_code == 400


def test_job_list_pages_with_keyset_links(app: App, client: TestClient) -> None:
    made = [app.enqueue("bulk.item", [n], queue="bulk").id for n in range(120)]
    seen: list[int] = []
    path = "/jobs?queue=bulk"
    while True:
        html = client.get(path).text
        seen += [int(n) for n in re.findall(r'<a href="/jobs/(\d+)">', html)]
        older = re.search(r'<a href="/jobs(\?[^"]+)" rel="next">', html)
        if older is None:
            break
        path = "/jobs" + older.group(1).replace("&amp;", "&")
        assert "before=" in path
    assert seen == sorted(made, reverse=True)


def test_job_page_shows_payload_error_progress_and_history(
    client: TestClient, seeded: Seeded
) -> None:
    failed = client.get(f"/jobs/{seeded.failed_id}").text
    assert "Traceback (most recent call last):" in failed
    assert "ConnectionError: SMTP relay refused the connection: 421 try later" in failed
    assert "&#34;format&#34;: &#34;pdf&#34;" in failed  # kwargs, escaped
    assert failed.count('class="kind kind-') == 3  # enqueued, claimed, failed
    assert ">worker-b<" in failed
    running = client.get(f"/jobs/{seeded.running_id}").text
    assert '<progress max="1" value="0.4">' in running and "page 4 of 10" in running
    assert client.get("/jobs/999999").status_code == 404


def test_job_data_is_escaped(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/jobs/{seeded.script_id}").text
    assert "<script>window.__pwned" not in html
    assert "&lt;script&gt;window.__pwned = 1;" in html
    assert SCRIPT_PAYLOAD not in client.get("/jobs?queue=web").text


# --- actions ----------------------------------------------------------------------------


def test_retry_with_form_token_queues_the_job_again(
    app: App, client: TestClient, seeded: Seeded
) -> None:
    token = csrf_of(client, f"/jobs/{seeded.failed_id}")
    response = post(client, f"/jobs/{seeded.failed_id}/retry", csrf_token=token)
    assert response.status_code == 303
    location = response.headers["location"]
    assert location == f"/jobs/{seeded.failed_id}?notice=retried"
    assert app.get(seeded.failed_id).state == JobState.QUEUED
    assert "Job queued again." in client.get(location).text
    # A second retry of the now queued job is refused with the store's reason.
    again = post(client, f"/jobs/{seeded.failed_id}/retry", csrf_token=token)
    assert again.status_code == 409


def test_posts_without_the_form_token_or_from_another_site_are_refused(
    app: App, client: TestClient, seeded: Seeded
) -> None:
    token = csrf_of(client)
    path = f"/jobs/{seeded.failed_id}/retry"
    assert post(client, path).status_code == 403
    assert post(client, path, csrf_token="guess").status_code == 403
    foreign = client.post(
        path,
        data={"csrf_token": token},
        headers={"Origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert foreign.status_code == 403
    assert client.get(path).status_code == 405  # actions are POST only
    assert app.get(seeded.failed_id).state == JobState.FAILED


def test_cancel_pause_resume_retry_all_and_purge(
    app: App, client: TestClient, seeded: Seeded
) -> None:
    token = csrf_of(client)
    assert (
        post(client, f"/jobs/{seeded.script_id}/cancel", csrf_token=token)
        .headers["location"]
        .endswith("notice=cancelled")
    )
    assert app.get(seeded.script_id).state == JobState.CANCELLED
    post(client, f"/jobs/{seeded.running_id}/cancel", csrf_token=token)
    assert app.get(seeded.running_id).cancel_requested

    post(client, "/queues/mail/pause", csrf_token=token)
    assert app.stats().queues["mail"].paused
    assert "paused</span>" in client.get("/").text
    post(client, "/queues/mail/resume", csrf_token=token)
    assert not app.stats().queues["mail"].paused

    response = post(client, "/queues/reports/retry-failed", csrf_token=token)
    assert response.headers["location"] == "/?notice=retried_all&n=1&queue=reports"
    assert app.get(seeded.failed_id).state == JobState.QUEUED
    assert (
        "Failed jobs of the queue reports queued again: 1."
        in client.get(response.headers["location"]).text
    )

    # Purge deletes what finished before the cutoff: nothing is a day old yet...
    response = post(client, "/purge", csrf_token=token, older_than="1d")
    assert response.headers["location"] == "/?notice=purged&n=0"
    # ...but a job that finished two hours ago is more than an hour old.
    (old,) = app.store.job_claim(["media"], 1, "w9", timedelta(seconds=30), utcnow())
    ended = utcnow() - timedelta(hours=2)
    app.store.job_finish([Finish.complete(old.id, old.lease_token or "", None)], ended)
    response = post(client, "/purge", csrf_token=token, older_than="1h")
    assert response.headers["location"] == "/?notice=purged&n=1"
    assert app.store.job_get(old.id) is None
    assert post(client, "/purge", csrf_token=token, older_than="1y").status_code == 409
    assert app.get(seeded.succeeded_id).state == JobState.SUCCEEDED


def test_queue_names_with_a_slash_reach_their_queue(app: App, client: TestClient) -> None:
    app.enqueue("t", [], queue="team/a")
    token = csrf_of(client)
    assert "/queues/team%2Fa/pause" in client.get("/").text
    post(client, "/queues/team%2Fa/pause", csrf_token=token)
    assert app.stats().queues["team/a"].paused


# --- token and host ---------------------------------------------------------------------


def test_token_is_needed_for_every_request(app: App, seeded: Seeded) -> None:
    with TestClient(create_app(app, token="s3cret"), base_url=BASE) as client:
        for path in ("/", "/jobs", f"/jobs/{seeded.failed_id}", "/metrics", "/audit"):
            assert client.get(path).status_code == 401, path
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.get("/jobs?state=failed&token=nope").status_code == 401

        login = client.get("/jobs?state=failed&token=s3cret", follow_redirects=False)
        assert login.status_code == 303
        assert login.headers["location"] == "/jobs?state=failed"  # token out of the address
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert client.get("/jobs?state=failed").status_code == 200  # with the cookie now
        token = csrf_of(client)
        retried = post(client, f"/jobs/{seeded.failed_id}/retry", csrf_token=token)
        assert retried.status_code == 303


def test_without_a_token_only_loopback_host_names_are_answered(app: App, seeded: Seeded) -> None:
    web = create_app(app)
    for base in (BASE, "http://localhost:8080", "http://[::1]:8080"):
        with TestClient(web, base_url=base) as client:
            assert client.get("/").status_code == 200, base
    # A foreign name that resolves to 127.0.0.1 (DNS rebinding) gets nothing.
    with TestClient(web, base_url="http://evil.example:8080") as client:
        assert client.get("/").status_code == 400
    # With a token, or when told to, any name is answered.
    with TestClient(create_app(app, token="t"), base_url="http://jobs.internal") as client:
        assert client.get("/", headers={"Authorization": "Bearer t"}).status_code == 200
    with TestClient(create_app(app, allowed_hosts=["*"]), base_url="http://a.b") as client:
        assert client.get("/").status_code == 200


# --- metrics and health -------------------------------------------------------------------


def samples(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            found[series] = float(value)
    return found


def test_metrics_gauges_and_counters(app: App, client: TestClient, seeded: Seeded) -> None:
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    first = samples(response.text)
    assert first['conveyor_jobs{queue="reports",state="failed"}'] == 1
    assert first['conveyor_jobs{queue="mail",state="succeeded"}'] == 2
    assert first["conveyor_workers"] == 1
    assert first['conveyor_worker_jobs_in_hand{host="build-01"}'] == 1
    assert first['conveyor_queue_oldest_ready_age_seconds{queue="mail"}'] >= 0
    assert first['conveyor_queue_oldest_ready_age_seconds{queue="reports"}'] == 0  # none ready
    assert first[f'conveyor_build_info{{version="{__version__}"}}'] == 1
    # Counters are the store's: the seed's events are counted, per queue and task.
    succeeded = {k: v for k, v in first.items() if k.startswith("conveyor_jobs_succeeded_total")}
    assert sum(succeeded.values()) >= 2 and all('task="' in k for k in succeeded)
    assert "# TYPE conveyor_jobs_succeeded_total counter" in response.text
    assert "# TYPE conveyor_job_run_seconds histogram" in response.text
    assert "# TYPE conveyor_job_queue_wait_seconds histogram" in response.text

    def total(text: str, prefix: str, queue: str) -> float:
        found = samples(text)
        return sum(v for k, v in found.items() if k.startswith(prefix + '{queue="' + queue))

    app.retry(seeded.failed_id)
    now = utcnow()
    done, broken = app.store.job_claim(["mail"], 2, "w9", timedelta(seconds=30), now)
    app.store.job_finish([Finish.complete(done.id, done.lease_token or "", None)], now)
    app.store.job_finish([Failure(broken.id, broken.lease_token or "", "boom", now)], now)
    second = client.get("/metrics").text
    ok = "conveyor_jobs_succeeded_total"
    assert total(second, ok, "mail") == total(response.text, ok, "mail") + 1
    retried = "conveyor_jobs_retried_total"
    assert total(second, retried, "mail") == total(response.text, retried, "mail") + 1
    manual = "conveyor_jobs_manually_retried_total"
    assert total(second, manual, "reports") == total(response.text, manual, "reports") + 1
    assert samples(second)['conveyor_jobs{queue="reports",state="failed"}'] == 0
    # A scrape with nothing new adds nothing (each event is folded once), and a
    # second dashboard on the same store reads the same counters.
    third = samples(client.get("/metrics").text)
    other = samples(Metrics(app).render())
    counters = {k: v for k, v in samples(second).items() if "_total" in k}
    assert {k: v for k, v in third.items() if "_total" in k} == counters
    assert {k: v for k, v in other.items() if "_total" in k} == counters


def test_histograms_are_cumulative_per_task(app: App, seeded: Seeded) -> None:
    metrics = Metrics(app)
    before = samples(metrics.render())
    jobs = app.store.job_claim(["mail", "media"], 3, "w9", timedelta(seconds=30), utcnow())
    app.store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in jobs], utcnow())
    counted = samples(metrics.render())
    for name in ("run", "queue_wait"):
        metric = f"conveyor_job_{name}_seconds"
        for labels in {
            k.split("{", 1)[1].rsplit("}", 1)[0] for k in counted if k.startswith(metric + "_count")
        }:
            buckets = [
                v for k, v in counted.items() if k.startswith(f"{metric}_bucket{{{labels},le=")
            ]
            assert len(buckets) == 14 and buckets == sorted(buckets)  # cumulative
            assert buckets[-1] == counted[f"{metric}_count{{{labels}}}"]
    run_counts = "conveyor_job_run_seconds_count"
    added = sum(v for k, v in counted.items() if k.startswith(run_counts)) - sum(
        v for k, v in before.items() if k.startswith(run_counts)
    )
    assert added == 3  # each job once
    # Each ran for well under a second (claimed, then completed at once).
    mail = [
        k
        for k in counted
        if k.startswith('conveyor_job_run_seconds_bucket{queue="mail"') and 'le="1.024"' in k
    ]
    assert mail and sum(counted[k] for k in mail) >= 2
    # Nothing new: the same histograms (no sample folded twice).
    again = samples(metrics.render())
    assert {k: v for k, v in again.items() if "_seconds_" in k} == {
        k: v for k, v in counted.items() if "_seconds_" in k
    }


def test_healthz(app: App, client: TestClient) -> None:
    body = client.get("/healthz").json()
    assert body["ok"] is True and body["schema_version"] == app.store.schema_version()


# --- the command ----------------------------------------------------------------------------


def test_command_refuses_a_public_address_without_a_token(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        dashboard,
        ["--dsn", f"sqlite:///{tmp_path / 'x.db'}", "--host", "0.0.0.0"],
        env={"CONVEYOR_DASHBOARD_TOKEN": ""},
    )
    assert result.exit_code == 2
    assert "refusing to listen on 0.0.0.0 without a token" in result.output


def test_command_serves_the_dashboard(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with App(f"sqlite:///{path}") as app:
        app.enqueue("t", [], queue="served")
    port = free_port()
    env = {**os.environ, "CONVEYOR_DSN": f"sqlite:///{path}"}
    env.pop("CONVEYOR_DASHBOARD_TOKEN", None)
    code = "from conveyor.web.commands import dashboard; dashboard()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        import httpx2

        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx2.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx2.TransportError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the dashboard did not start"
                time.sleep(0.1)
        assert response.status_code == 200 and ">served</a>" in response.text
        # Reached by another name for this machine: refused without a token.
        other = httpx2.get(f"http://127.0.0.1:{port}/", headers={"Host": "evil.example"}, timeout=2)
        assert other.status_code == 400
    finally:
        proc.terminate()
        try:
            output = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:  # never left running, nor its pipe open
            proc.kill()
            output = proc.communicate()[0]
    assert f"conveyor dashboard on http://127.0.0.1:{port}/" in output


def test_command_without_the_web_extra_says_how_to_get_it() -> None:
    # None in sys.modules makes an import fail as if the package were not installed.
    code = (
        "import sys\n"
        "for name in ('starlette', 'jinja2', 'uvicorn'):\n"
        "    sys.modules[name] = None\n"
        "from click.testing import CliRunner\n"
        "from conveyor.web.commands import dashboard\n"
        "result = CliRunner().invoke(dashboard, [])\n"
        "print(result.exit_code, result.output)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.startswith("1 ")
    assert "pip install 'conveyor[web]'" in run.stdout
