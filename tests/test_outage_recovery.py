"""The dashboard's pages are back as soon as the store is: a /healthz that reaches it ends
the outage for every page, without waiting for the pages' next try."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

import conveyor.web.outage
from conveyor import App
from conveyor.web import create_app
from pg_server import PgServer

BASE = "http://127.0.0.1"


def test_a_healthz_that_reaches_the_store_ends_the_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pages alone would try again in ten minutes: only /healthz can end it sooner.
    monkeypatch.setattr(conveyor.web.outage, "RETRY_SECONDS", 600.0)
    server = PgServer()
    server.start()
    try:
        with App(server.dsn, connect_timeout=2) as app:
            app.migrate()
            app.enqueue("t", [], queue="back")
            with TestClient(create_app(app), base_url=BASE) as client:
                assert client.get("/").status_code == 200
                server.halt()
                assert client.get("/").status_code == 503
                server.start()
                assert client.get("/").status_code == 503  # the pages' next try is far off
                deadline = time.monotonic() + 30
                while client.get("/healthz").status_code != 200:
                    assert time.monotonic() < deadline, "/healthz never reached the store"
                    time.sleep(0.2)
                page = client.get("/")
                assert page.status_code == 200 and "back" in page.text
    finally:
        server.stop()
