"""Who may use the dashboard and in which role, its session cookie, and the audit of its
actions; the dashboard mounted under a path inside a host application with its own login."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from conveyor import App
from conveyor.audit import entries
from conveyor.job import JobState
from conveyor.web import create_app
from conveyor.web.security import SESSION_COOKIE
from dashboard_seed import Seeded, seed
from host_app import MOUNT, host_app

BASE = "http://127.0.0.1"
ADMIN, READ = "admin-s3cret", "read-s3cret"


@pytest.fixture
def seeded(app: App) -> Seeded:
    return seed(app)


@pytest.fixture
def sqlite_app(tmp_path: Any) -> Iterator[tuple[App, Seeded]]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:
        application.migrate()
        yield application, seed(application)


def csrf_of(client: TestClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match, f"no form token on {path}"
    return match.group(1)


def action_buttons(html: str) -> int:
    """Buttons inside the page's POST forms."""
    forms = re.findall(r'<form method="post".*?</form>', html, flags=re.DOTALL)
    return sum(form.count("<button") for form in forms)


def post(client: TestClient, path: str, **form: str) -> Any:
    return client.post(path, data=form, follow_redirects=False)


def test_read_token_sees_every_page_and_no_button_and_may_not_act(
    sqlite_app: tuple[App, Seeded],
) -> None:
    app, seeded = sqlite_app
    web = create_app(app, ADMIN, read_token=READ)
    with TestClient(web, base_url=BASE) as reader, TestClient(web, base_url=BASE) as admin:
        assert reader.get(f"/?token={READ}").status_code == 200
        assert admin.get(f"/?token={ADMIN}").status_code == 200
        for path in ("/", "/jobs?state=failed", f"/jobs/{seeded.failed_id}", "/limits/mail"):
            page = reader.get(path)
            assert page.status_code == 200, path
            assert action_buttons(page.text) == 0, path
            assert action_buttons(admin.get(path).text) > 0, path
        assert "Delete…" not in reader.get("/").text and "Housekeeping" not in reader.get("/").text
        # The form token is the same for everyone: only the role stops a reader.
        token = csrf_of(admin, f"/jobs/{seeded.failed_id}")
        for path, form in (
            (f"/jobs/{seeded.failed_id}/retry", {}),
            ("/queues/mail/pause", {}),
            ("/purge", {"older_than": "0s"}),
            ("/limits/mail/set", {"rate": "5/s"}),
            ("/jobs/bulk-matching", {"action": "delete", "state": "failed"}),
        ):
            refused = post(reader, path, csrf_token=token, **form)
            assert refused.status_code == 403, path
            assert "read token may read this dashboard but not act" in refused.text
        assert app.get(seeded.failed_id).state == JobState.FAILED
        assert not app.stats().queues["mail"].paused
        # By bearer token too.
        bearer = reader.post(
            "/queues/mail/pause",
            data={"csrf_token": token},
            headers={"Authorization": f"Bearer {READ}"},
        )
        assert bearer.status_code == 403
        assert post(admin, "/queues/mail/pause", csrf_token=token).status_code == 303
        assert app.stats().queues["mail"].paused


def test_session_cookie_is_signed_and_holds_no_token(sqlite_app: tuple[App, Seeded]) -> None:
    app, _ = sqlite_app
    with TestClient(create_app(app, ADMIN, read_token=READ), base_url=BASE) as client:
        assert client.get("/healthz").status_code == 200  # open: no token needed
        assert client.get("/").status_code == 401
        login = client.get(f"/jobs?token={ADMIN}", follow_redirects=False)
        cookie = login.headers["set-cookie"]
        assert ADMIN not in cookie and READ not in cookie
        value = client.cookies[SESSION_COOKIE]
        assert client.get("/").status_code == 200
        # A reader's session rewritten to say "admin" loses its signature.
        reader = client.get(f"/?token={READ}", follow_redirects=False)
        assert reader.status_code == 303
        payload, _, signature = client.cookies[SESSION_COOKIE].rpartition(".")
        data = json.loads(base64.urlsafe_b64decode(payload))
        assert data["r"] == "read" and "read-s3cret" not in json.dumps(data)
        forged = base64.urlsafe_b64encode(json.dumps({**data, "r": "admin"}).encode()).decode()
        for cookie in (f"{forged}.{signature}", "", "junk", f"{payload}.{'0' * 64}"):
            client.cookies.clear()
            client.cookies.set(SESSION_COOKIE, cookie)
            assert client.get("/").status_code == 401, cookie
        # The same session is good for another process with the same token...
    with TestClient(create_app(app, ADMIN, read_token=READ), base_url=BASE) as again:
        again.cookies.clear()
        again.cookies.set(SESSION_COOKIE, value)
        assert again.get("/").status_code == 200
    # ... and void once the token (or the secret) changes.
    with TestClient(create_app(app, "another"), base_url=BASE) as changed:
        changed.cookies.set(SESSION_COOKIE, value)
        assert changed.get("/").status_code == 401
    with pytest.raises(ValueError, match="must differ"):
        create_app(app, "same", read_token="same")


def test_trusted_header_users_get_their_roles(sqlite_app: tuple[App, Seeded]) -> None:
    app, seeded = sqlite_app
    web = create_app(app, user_header="X-Forwarded-User", roles={"alice": "admin", "bob": "read"})
    with TestClient(web, base_url="http://ops.example") as client:
        assert client.get("/").status_code == 401  # nobody named
        as_bob = {"X-Forwarded-User": "bob"}
        as_alice = {"X-Forwarded-User": "alice"}
        assert client.get("/", headers=as_bob).status_code == 200
        carol = client.get("/", headers={"X-Forwarded-User": "carol"})
        assert carol.status_code == 403 and "carol may not use this dashboard" in carol.text
        token = csrf_of(client, "/healthz") if False else None
        page = client.get(f"/jobs/{seeded.failed_id}", headers=as_alice).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        path = f"/jobs/{seeded.failed_id}/retry"
        form = {"csrf_token": token.group(1)}
        refused = client.post(path, data=form, headers=as_bob, follow_redirects=False)
        assert refused.status_code == 403
        done = client.post(path, data=form, headers=as_alice, follow_redirects=False)
        assert done.status_code == 303
    assert app.get(seeded.failed_id).state == JobState.QUEUED
    [entry] = entries(app, 10)
    assert (entry.actor, entry.source, entry.action, entry.target, entry.jobs) == (
        "alice",
        "dashboard",
        "retry",
        f"job {seeded.failed_id}",
        1,
    )
    # A callable maps users too; without the header configured, the header means nothing.
    web = create_app(app, ADMIN, user_header="X-User", roles=lambda u: "read" if u else None)
    with TestClient(web, base_url=BASE) as client:
        assert client.post("/queues/mail/pause", headers={"X-User": "dan"}).status_code == 403
    with TestClient(create_app(app, ADMIN), base_url=BASE) as client:
        assert client.get("/", headers={"X-Forwarded-User": "alice"}).status_code == 401


def test_every_action_is_in_the_audit_with_who_what_and_how_many(app: App, seeded: Seeded) -> None:
    with TestClient(create_app(app, ADMIN), base_url=BASE) as client:
        client.get(f"/?token={ADMIN}")
        token = csrf_of(client, "/")
        assert post(client, "/queues/mail/pause", csrf_token=token).status_code == 303
        assert post(client, "/queues/reports/retry-failed", csrf_token=token).status_code == 303
        post(client, "/limits/mail/set", csrf_token=token, rate="5/s", concurrency="2")
        post(client, "/jobs/bulk", csrf_token=token, action="delete", id=str(seeded.succeeded_id))
        post(client, "/purge", csrf_token=token, older_than="0s")
        # A refused action (nothing changed) is not recorded.
        assert post(client, f"/jobs/{seeded.running_id}/retry", csrf_token=token).status_code == 409
        page = client.get("/audit")
    found = [(e.action, e.target, e.jobs) for e in entries(app, 50)]
    assert found[:4] == [
        ("purge", "finished jobs older_than=0s", found[0][2]),
        ("delete", f"jobs {seeded.succeeded_id}", 1),
        ("limit set", "queue mail: rate 5/s, concurrency 2", None),
        ("retry failed", "queue reports", 1),
    ]
    assert found[4] == ("pause", "queue mail", None)
    assert len(found) == 5
    assert {e.actor for e in entries(app, 50)} == {"admin token"}
    assert page.status_code == 200
    assert page.text.count("<tr>") == 5 + 1  # a row per entry, and the header's
    assert "queue mail: rate 5/s, concurrency 2" in page.text


def test_mounted_inside_a_host_app_with_its_own_login(sqlite_app: tuple[App, Seeded]) -> None:
    app, seeded = sqlite_app
    dashboard = create_app(app, roles={"alice": "admin", "*": "read"})
    with TestClient(host_app(dashboard), base_url="http://intranet.example") as client:
        assert client.get(f"{MOUNT}/").status_code == 401  # not logged in to the host
        assert client.get(f"{MOUNT}/healthz").status_code == 200
        client.get("/login?user=alice")
        page = client.get(f"{MOUNT}/jobs?state=failed").text
        links = re.findall(r'(?:href|action|data-src|src)="(/[^"]*)"', page)
        assert links and all(link.startswith(MOUNT + "/") for link in links), links
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get(MOUNT + "/").text)
        assert token
        done = post(client, f"{MOUNT}/jobs/{seeded.failed_id}/retry", csrf_token=token.group(1))
        assert done.status_code == 303
        assert done.headers["location"].startswith(f"{MOUNT}/jobs/{seeded.failed_id}?notice=")
        bulk = post(client, f"{MOUNT}/jobs/bulk", csrf_token=token.group(1), action="retry")
        assert bulk.headers["location"].startswith(f"{MOUNT}/jobs?")
        client.get("/login?user=mallory")  # anyone else reads
        assert action_buttons(client.get(f"{MOUNT}/").text) == 0
        refused = post(client, f"{MOUNT}/queues/mail/pause", csrf_token=token.group(1))
        assert refused.status_code == 403
    [entry] = entries(app, 10)
    assert (entry.actor, entry.action) == ("alice", "retry")


def test_token_login_inside_a_mount_keeps_to_the_mount(sqlite_app: tuple[App, Seeded]) -> None:
    app, _ = sqlite_app
    dashboard = create_app(app, ADMIN, read_token=READ)
    with TestClient(host_app(dashboard), base_url="http://intranet.example") as client:
        login = client.get(f"{MOUNT}/jobs?state=failed&token={READ}", follow_redirects=False)
        assert login.status_code == 303
        assert login.headers["location"] == f"{MOUNT}/jobs?state=failed"
        assert f"Path={MOUNT}" in login.headers["set-cookie"]
        page = client.get(f"{MOUNT}/jobs?state=failed")
        assert page.status_code == 200
        assert "Read only: read token sees every page" in page.text
        assert client.get("/").text == "host home of nobody"  # the host's own pages are its own


def test_command_refuses_roles_it_cannot_use(tmp_path: Any) -> None:
    from click.testing import CliRunner

    from conveyor.web.commands import dashboard

    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    wrong = CliRunner().invoke(
        dashboard, ["--dsn", dsn, "--trust-user-header", "X-User", "--role", "bob=owner"]
    )
    assert wrong.exit_code == 2 and "give USER=admin or USER=read, got 'bob=owner'" in wrong.output
    alone = CliRunner().invoke(dashboard, ["--dsn", dsn, "--role", "bob=read"])
    assert (
        alone.exit_code == 2 and "--role maps the users --trust-user-header names" in alone.output
    )
    same = CliRunner().invoke(dashboard, ["--dsn", dsn, "--token", "t", "--read-token", "t"])
    assert same.exit_code == 2 and "the read token must differ" in same.output
