"""The overview of the demo's database at 1280, 1366 and 1920 px and on a 390 px phone:
no panel scrolls sideways and the page is no wider than the window."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from conveyor import App
from conveyor.cli.demo import Workload, enqueue_workload
from conveyor.cli.demo_tasks import register
from conveyor.job import utcnow
from conveyor.store.records import Finish
from dashboard_server import serve
from test_dashboard_browser import at_width, browser, console_errors, fresh, wait_for

__all__ = ["browser"]  # the module's fixture, used here

LEASE = timedelta(seconds=60)
#: Queues of the demo and a worker for each, with ids as long as real ones.
WORKERS = (
    ("images", "build-host-01.example.com:48211:9f3c2a1b"),
    ("integrations", "build-host-02.example.com:48212:0c1d2e3f"),
)


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """The demo's 20,000 jobs, most of them done, some failed, some running, a limit."""
    path = tmp_path_factory.mktemp("overview") / "demo.db"
    with App(f"sqlite:///{path}") as app:
        app.migrate()
        register(app)
        enqueue_workload(app, Workload(20_000))
        store, now = app.store, utcnow()
        for queue, worker in WORKERS:
            store.worker_register(worker, worker.split(":")[0], 48211, [queue], 16, now)
            while claimed := store.job_claim([queue], 1000, worker, LEASE, now):
                kind = "fail" if queue == "integrations" else "complete"
                store.job_finish(
                    [Finish(j.id, j.lease_token or "", kind, result_json="null", error="E: x")  # type: ignore[arg-type]
                     for j in claimed[: len(claimed) - 3]],
                    now,
                )  # fmt: skip
                if len(claimed) < 1000:
                    break
        app.limit("integrations", concurrency=3)
        yield app


@pytest.mark.parametrize("width", [1280, 1366, 1920, 390])
def test_no_panel_of_the_overview_scrolls_sideways(
    browser: WebDriver, demo_like: App, width: int
) -> None:
    fresh(browser)
    with at_width(browser, width), serve(demo_like) as base:
        browser.get(base + "/")
        wait_for(browser, "table")
        assert "images" in browser.page_source  # the demo's queues are shown
        wide = browser.execute_script(
            "return [...document.querySelectorAll('.panel')]"
            ".filter(p => p.scrollWidth > p.clientWidth + 1)"
            ".map(p => (p.querySelector('h2') || p).textContent.trim().slice(0, 40)"
            " + ': ' + p.scrollWidth + ' > ' + p.clientWidth)"
        )
        assert wide == [], wide
        page = browser.execute_script("return document.documentElement.scrollWidth")
        assert page <= width, page
        # Each row's buttons line up: Pause starts at the same x in every row.
        lefts = browser.execute_script(
            "return [...document.querySelectorAll('table.queues td.actions button')]"
            ".filter(b => b.textContent.trim() === 'Pause')"
            ".map(b => Math.round(b.getBoundingClientRect().left))"
        )
        assert len(lefts) == 3 and (width < 500 or len(set(lefts)) == 1), lefts
        assert console_errors(browser) == []
