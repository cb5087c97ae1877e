"""The dashboard's main pages, as docs/dashboard.md shows them, in a real headless Chromium.

Each page renders with no console error, and its screenshot under
docs/images/ exists and is referenced by the docs. With
``CONVEYOR_UPDATE_SCREENSHOTS=1`` the test saves the screenshots afresh:

    CONVEYOR_UPDATE_SCREENSHOTS=1 .venv/bin/pytest tests/test_screenshots.py
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from conveyor import App, Context, Workflow
from conveyor.testing import drain
from dashboard_seed import Seeded, seed
from dashboard_server import serve
from test_dashboard_browser import browser, console_errors, fresh, wait_for
from test_dashboard_tasks import run

__all__ = ["browser"]  # the module's fixture, used here

DOCS = Path(__file__).resolve().parent.parent / "docs"
IMAGES = DOCS / "images"
UPDATE = os.environ.get("CONVEYOR_UPDATE_SCREENSHOTS") == "1"
#: The width of a laptop's browser window, and a height that shows a page's top part.
WIDTH, HEIGHT = 1280, 860
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[App, Seeded, str]]:
    """A database with something on every page: queues, a failed job, limits, task metrics,
    and a workflow whose failure cancelled what came after it."""
    path = tmp_path_factory.mktemp("screenshots") / "jobs.db"
    with App(f"sqlite:///{path}") as app:
        app.migrate()
        for n in range(24):
            run(app, "mail", "mail.send", wait=0.1 * (n % 7 + 1), ran=0.03 * (n % 5 + 1))
        run(app, "mail", "mail.digest", wait=2.5, ran=1.2, kind="fail")
        run(app, "media", "thumbs.make", wait=0.4, ran=3.5)
        ids = seed(app)
        app.limit("partner", concurrency=3)
        app.limit("partner", rate="5/s", per_key=True)
        app.throttle("partner", 600, limit_key="acme")
        for n in range(3):
            app.enqueue("partner.call", [n], queue="partner", limit_key="acme")

        @app.task(queue="etl", max_attempts=1)
        def extract(ctx: Context, source: str) -> int:
            if source == "crm":
                raise ConnectionError("crm.example.com refused the connection")
            return len(source)

        @app.task(queue="etl")
        def load(ctx: Context) -> int:
            return sum(ctx.upstream.values())

        wf = Workflow("nightly-2026-11-24", name="nightly")
        named = lambda args, kwargs: f"extract {args[0]}"  # noqa: E731
        sources = [wf.add(extract.step(s), label=named) for s in ("billing", "crm", "web")]
        wf.add(load.step(), after=sources, label="load the warehouse")
        wf.enqueue()
        drain(app, ["etl"])
        yield app, ids, wf.id


def pages(ids: Seeded, workflow: str) -> dict[str, tuple[str, str]]:
    """Screenshot name -> (path, a CSS selector the page shows once drawn)."""
    return {
        "overview": ("/", "table"),
        "job": (f"/jobs/{ids.failed_id}", "main"),
        "limits": ("/limits/partner", "form"),
        "tasks": ("/tasks", "svg.chart"),
        "workflows": (f"/workflows/{workflow}", "svg"),
    }


def test_each_main_page_renders_and_its_screenshot_is_in_the_docs(
    browser: WebDriver, shown: tuple[App, Seeded, str]
) -> None:
    app, ids, workflow = shown
    fresh(browser)
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    guide = (DOCS / "dashboard.md").read_text()
    try:
        with serve(app) as base:
            for name, (path, drawn) in pages(ids, workflow).items():
                browser.get(base + path)
                wait_for(browser, drawn)
                assert "Internal Server Error" not in browser.page_source, path
                assert console_errors(browser) == [], path
                image = IMAGES / f"dashboard-{name}.png"
                if UPDATE:
                    IMAGES.mkdir(exist_ok=True)
                    assert browser.save_screenshot(str(image))
                assert image.read_bytes().startswith(PNG_SIGNATURE), image
                assert f"](images/dashboard-{name}.png)" in guide, f"{image.name} is not shown"
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
