"""Limits where they are seen: set, change and clear a limit and lift a throttle from the
dashboard, with the form token every action needs, on every store."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

from conveyor import App
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def token_of(client: TestClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match
    return match.group(1)


def post(client: TestClient, path: str, **form: str) -> Any:
    return client.post(path, data=form, follow_redirects=False)


def test_set_change_clear_a_limit_and_lift_a_throttle(app: App) -> None:
    for n in range(8):
        app.enqueue("api.call", [n], queue="partner", limit_key=f"c-{n % 2}")
    with TestClient(create_app(app), base_url=BASE) as client:
        overview = client.get("/").text
        assert 'href="/limits/partner">Limit…</a>' in overview
        page = client.get("/limits/partner").text
        assert "No limit and no throttle" in page
        token = token_of(client, "/limits/partner")
        # The same checks as every action: no token, no change.
        refused = post(client, "/limits/partner/set", rate="1/m")
        assert refused.status_code == 403 and app.limits() == {}
        assert 'data-confirm="Set this limit on partner?' in page

        done = post(client, "/limits/partner/set", csrf_token=token, rate="1/m", concurrency="2")
        assert done.status_code == 303
        assert done.headers["location"] == "/limits/partner?notice=limit_set&queue=partner"
        status = app.limits()["partner"]
        assert str(status.limit) == "1/m, 2 at once"
        shown = client.get(done.headers["location"]).text
        assert "Limit set on partner: workers obey it from their next claim." in shown
        assert "0 running; limit 2 · 0 started in the last minute; limit 1" in shown
        assert 'href="/limits/partner">Change…</a>' in client.get("/").text

        post(client, "/limits/partner/set", csrf_token=token, rate="5/s", scope="key")
        assert str(app.limits()["partner"].key_limit) == "5/s"
        assert str(app.limits()["partner"].limit) == "1/m, 2 at once"  # the other scope stays
        changed = post(client, "/limits/partner/set", csrf_token=token, concurrency="3")
        assert changed.status_code == 303
        assert str(app.limits()["partner"].limit) == "3 at once"

        bad = post(client, "/limits/partner/set", csrf_token=token, rate="ten a second")
        assert bad.status_code == 400 and "cannot read rate" in bad.text
        zero = post(client, "/limits/partner/set", csrf_token=token, concurrency="0")
        assert zero.status_code == 400 and "concurrency must be from 1" in zero.text
        empty = post(client, "/limits/partner/set", csrf_token=token)
        assert empty.status_code == 400 and "give a rate" in empty.text

        app.throttle("partner", 600)
        app.throttle("partner", 600, limit_key="c-1")
        page = client.get("/limits/partner").text
        assert "Lift the throttle" in page and "1 key throttled" in page
        lifted = post(client, "/limits/partner/lift", csrf_token=token)
        assert lifted.headers["location"] == "/limits/partner?notice=throttle_lifted&queue=partner"
        assert app.limits()["partner"].throttled_until is None
        post(client, "/limits/partner/lift", csrf_token=token, limit_key="c-1")
        assert app.limits()["partner"].keys_throttled == 0

        post(client, "/limits/partner/clear", csrf_token=token, scope="key")
        assert app.limits()["partner"].key_limit is None
        cleared = post(client, "/limits/partner/clear", csrf_token=token, scope="queue")
        assert cleared.headers["location"] == "/limits/partner?notice=limit_cleared&queue=partner"
        assert "partner" not in app.limits()
        assert "No limit and no throttle" in client.get("/limits/partner").text
