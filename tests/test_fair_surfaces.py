"""Fair turns where they are seen: the fair panel of a queue's page on the dashboard
(and its form, with the token every action needs) and /metrics, on every store."""

from __future__ import annotations

import re
import time
from datetime import timedelta

from starlette.testclient import TestClient

from conveyor import App
from conveyor.job import NewJob, utcnow
from conveyor.web import create_app

BASE = "http://127.0.0.1"


def _jobs(key: str, count: int) -> list[NewJob]:
    now = utcnow()
    return [
        NewJob(task="t", queue="q", limit_key=key, args_json="[]", kwargs_json="{}", run_at=now)
        for _ in range(count)
    ]


def test_the_dashboard_and_metrics_show_a_fair_queue(app: App) -> None:
    app.enqueue_many(_jobs("gold", 40) + _jobs("a'b<", 40))
    with TestClient(create_app(app), base_url=BASE) as client:
        page = client.get("/limits/q").text
        assert "Not fair: claims take the oldest ready job" in page
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        refused = client.post("/limits/q/fair", data={"weights": "gold=3"}, follow_redirects=False)
        assert refused.status_code == 403
        done = client.post(
            "/limits/q/fair",
            data={"csrf_token": token.group(1), "weights": "gold=3", "default_weight": "1"},
            follow_redirects=False,
        )
        assert done.status_code == 303
        assert done.headers["location"] == "/limits/q?notice=fair_set&queue=q"
        time.sleep(1.1)  # what a store read of fair queues, it trusts for a second
        started = [j.limit_key for j in app.store.job_claim(["q"], 20, "w", timedelta(minutes=1))]
        assert started.count("gold") == 15, started
        shown = client.get(done.headers["location"]).text
        assert "Fair turns set" in shown
        assert "yes, by fair_key (by default limit_key)" in shown
        assert '<span class="mono">gold</span>=3' in shown
        assert "a&#39;b&lt;" in shown and "a'b<" not in shown  # a key is data, escaped
        assert "75%" in shown and "25%" in shown
        metrics = client.get("/metrics").text
        assert 'conveyor_fair_key_starts_total{queue="q",key="gold"} 15' in metrics
        assert 'conveyor_fair_key_queued{queue="q",key="gold"} 25' in metrics
        bad = client.post(
            "/limits/q/fair",
            data={"csrf_token": token.group(1), "weights": "gold=-1"},
            follow_redirects=False,
        )
        assert bad.status_code == 400 and "above 0" in bad.text
        off = client.post(
            "/limits/q/fair",
            data={"csrf_token": token.group(1), "off": "1"},
            follow_redirects=False,
        )
        assert off.headers["location"] == "/limits/q?notice=fair_off&queue=q"
        assert "Not fair" in client.get("/limits/q").text
        assert "conveyor_fair_key_starts_total{" not in client.get("/metrics").text
    assert [e.action for e in app.store.audit_list(2)] == ["fair off", "fair"]  # type: ignore[attr-defined]
