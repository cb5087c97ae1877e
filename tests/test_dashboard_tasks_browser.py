"""The tasks page in a real headless Chromium: its charts drawn, no console error
(the page's SVG needs no inline style the policy would refuse), and nothing
scrolling sideways at 1366 px or on a phone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from conveyor import App
from dashboard_server import serve
from test_dashboard_browser import at_width, browser, console_errors, fresh, wait_for
from test_dashboard_tasks import run

__all__ = ["browser"]  # the module's fixture, used here


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.migrate()
        for n in range(12):
            run(app, "mail", "send", wait=0.1 * (n + 1), ran=0.02 * (n + 1))
        run(app, "mail", "digest", wait=3.0, ran=1.5, kind="fail")
        run(app, "media", "resize", wait=0.5, ran=4.0)
        yield app


@pytest.mark.parametrize("width", [1366, 390])
def test_the_tasks_page_draws_its_charts(
    browser: WebDriver, busy: App, tmp_path: Path, width: int
) -> None:
    fresh(browser)
    with at_width(browser, width), serve(busy) as base:
        browser.get(base + "/tasks")
        wait_for(browser, "svg.chart")
        assert browser.save_screenshot(str(tmp_path / f"tasks-{width}.png"))
        lines = browser.execute_script(
            "return document.querySelectorAll('svg.chart polyline.line').length"
        )
        assert lines >= 6  # p50, p95, p99 of wait and of run time
        stroke = browser.execute_script(
            "return getComputedStyle(document.querySelector('polyline.line-p99')).stroke"
        )
        assert stroke not in ("", "none")  # styled by the stylesheet
        bars = browser.execute_script(
            "return document.querySelectorAll('svg.chart rect.bar-succeeded').length"
        )
        assert bars >= 1
        scroll = browser.execute_script("return document.documentElement.scrollWidth")
        assert scroll <= width, scroll
        browser.get(base + "/tasks?window=week&queue=mail&task=send")
        wait_for(browser, "svg.chart")
        assert "mail · send" in browser.page_source
        assert console_errors(browser) == []
