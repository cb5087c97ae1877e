"""The dashboard says why a job is not running, and the limits page names throttled keys
with their end and lifts each with one click, on every store."""

from __future__ import annotations

import html
import os
import re
import socket
from datetime import timedelta
from typing import Any

from starlette.testclient import TestClient

from conveyor import App
from conveyor.job import utcnow
from conveyor.web import create_app

BASE = "http://127.0.0.1"
#: A key is data: spaces at its ends, quotes, markup.
ODD_KEY = ' c <1> "x" '


def token_of(client: TestClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert match
    return match.group(1)


def post(client: TestClient, path: str, **form: str) -> Any:
    return client.post(path, data=form, follow_redirects=False)


def why_section(page: str) -> str:
    match = re.search(r'<section class="panel" id="job-why">(.*?)</section>', page, re.S)
    assert match, "no why section"
    return html.unescape(match.group(1))


def test_the_job_page_says_why_a_ready_job_does_not_run(app: App) -> None:
    app.store.worker_register("w1", socket.gethostname(), os.getpid(), ["partner"], 4, utcnow())
    job = app.enqueue("api.call", [1], queue="partner", limit_key=ODD_KEY)
    free = app.enqueue("api.call", [2], queue="partner")
    until = app.throttle("partner", 600, limit_key=ODD_KEY)
    with TestClient(create_app(app), base_url=BASE) as client:
        section = why_section(client.get(f"/jobs/{job.id}").text)
        assert f"limit key {ODD_KEY!r} of queue 'partner' is throttled until" in section
        assert f"{until:%H:%M:%S} UTC" in section
        assert 'href="/limits/partner">its limits »</a>' in section
        assert "Nothing holds it back" in why_section(client.get(f"/jobs/{free.id}").text)

        app.pause("partner")
        section = why_section(client.get(f"/jobs/{free.id}?live=1").text)
        assert "queue 'partner' is paused" in section

        # A job that runs or has ended has no such section.
        app.resume("partner")
        claimed = app.store.job_claim(["partner"], 5, "w1", timedelta(seconds=30))
        assert [j.id for j in claimed] == [free.id]
        assert 'id="job-why"' not in client.get(f"/jobs/{free.id}").text


def test_the_limits_page_names_throttled_keys_and_lifts_each(app: App) -> None:
    for key in (ODD_KEY, "c-2", "c-3"):
        app.enqueue("api.call", [1], queue="partner", limit_key=key)
    ends = {key: app.throttle("partner", seconds, limit_key=key)
            for key, seconds in ((ODD_KEY, 60), ("c-2", 600), ("c-3", 3600))}  # fmt: skip
    with TestClient(create_app(app), base_url=BASE) as client:
        page = client.get("/limits/partner").text
        table = re.search(
            r'<table class="grid stack" id="throttled-keys">(.*?)</table>', page, re.S
        )
        assert table
        rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)[1:]
        shown = [html.unescape(re.sub(r"<[^>]+>", " ", row)) for row in rows]
        # Soonest end first, each with its end and a button that lifts it alone.
        assert [k for k in (ODD_KEY, "c-2", "c-3") if any(k in s for s in shown)] == [
            ODD_KEY, "c-2", "c-3"
        ]  # fmt: skip
        assert ODD_KEY in shown[0] and "c-2" in shown[1] and "c-3" in shown[2]
        assert f"{ends['c-3']:%H:%M:%S}" in shown[2]
        assert 'name="limit_key" value=" c &lt;1&gt; &#34;x&#34; "' in rows[0]
        assert "Another limit key" not in page  # every throttled key is listed
        overview = client.get("/").text
        assert 'href="/limits/partner#throttled-keys">3 keys</a>' in overview

        token = token_of(client, "/limits/partner")
        lifted = post(client, "/limits/partner/lift", csrf_token=token, limit_key=ODD_KEY)
        assert lifted.headers["location"] == "/limits/partner?notice=throttle_lifted&queue=partner"
        left = app.store.limit_throttled_keys(utcnow(), 10, "partner")
        assert [t.limit_key for t in left] == ["c-2", "c-3"]
        assert [t.until for t in left] == [ends["c-2"], ends["c-3"]]
        page = html.unescape(client.get("/limits/partner").text)
        assert ODD_KEY not in page and "c-2" in page


def test_throttled_keys_are_read_per_queue_and_across_queues(app: App) -> None:
    app.throttle("a", 60, limit_key="k1")
    app.throttle("b", 30, limit_key="k1")
    app.throttle("b", 90, limit_key="k2")
    now = utcnow()
    every = app.store.limit_throttled_keys(now, 10)
    assert [(t.queue, t.limit_key) for t in every] == [("b", "k1"), ("a", "k1"), ("b", "k2")]
    assert [t.limit_key for t in app.store.limit_throttled_keys(now, 10, "b")] == ["k1", "k2"]
    assert len(app.store.limit_throttled_keys(now, 2)) == 2
    app.throttle("b", 0, limit_key="k1")
    assert [t.limit_key for t in app.store.limit_throttled_keys(utcnow(), 10, "b")] == ["k2"]
