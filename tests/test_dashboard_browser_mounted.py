"""The dashboard mounted under /ops/queue inside a host application that has its own login,
in a real headless Chromium: every link and action stays inside the mount, the host's
users get their roles, and the audit names them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from conveyor import App
from conveyor.job import JobState
from conveyor.web import create_app
from dashboard_seed import Seeded, seed
from host_app import MOUNT, host_app, serve_asgi
from test_dashboard_browser import browser, console_errors, fresh, wait_for

__all__ = ["browser"]  # the module's browser fixture, shared


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[tuple[App, Seeded]]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.migrate()
        yield app, seed(app)


def links_in_page(driver: WebDriver) -> list[str]:
    """Every address the page links to, posts to, loads or refreshes from, made absolute."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll("
        "'a[href], form[action], [data-src], link[href], script[src]')).map(e => new URL("
        "['href', 'action', 'src', 'data-src'].map(n => e.getAttribute(n)).find(v => v),"
        " location.href).href)"
    )
    return [str(link) for link in found]


def test_mounted_dashboard_behind_the_host_login(
    browser: WebDriver, seeded: tuple[App, Seeded], tmp_path: Path
) -> None:
    fresh(browser)
    app, ids = seeded
    dashboard = create_app(app, roles={"alice": "admin", "*": "read"})
    with serve_asgi(host_app(dashboard)) as base:
        inside = base + MOUNT + "/"
        browser.get(inside)
        assert "needs its token" in browser.find_element(By.TAG_NAME, "body").text
        console_errors(browser)  # the 401 just seen (and the host's missing favicon)
        browser.get(f"{base}/login?user=alice&next={MOUNT}/")
        wait_for(browser, "table.queues")
        links = links_in_page(browser)
        assert len(links) > 20
        assert [link for link in links if not link.startswith(inside)] == []

        browser.find_element(By.LINK_TEXT, "Failed").click()
        wait_for(browser, "table.jobs")
        assert browser.current_url.startswith(inside + "jobs?state=failed")
        assert [link for link in links_in_page(browser) if not link.startswith(inside)] == []
        browser.find_element(By.LINK_TEXT, str(ids.failed_id)).click()
        wait_for(browser, "#job-error")
        assert [link for link in links_in_page(browser) if not link.startswith(inside)] == []
        browser.find_element(By.XPATH, "//button[text()='Retry']").click()
        wait_for(browser, ".notice")
        assert browser.find_element(By.CSS_SELECTOR, ".notice").text == "Job queued again."
        assert browser.current_url.startswith(f"{inside}jobs/{ids.failed_id}?notice=retried")
        assert app.get(ids.failed_id).state == JobState.QUEUED
        browser.save_screenshot(str(tmp_path / "mounted-retried.png"))

        browser.find_element(By.LINK_TEXT, "Audit").click()
        wait_for(browser, "table#audit")
        row = browser.find_element(By.CSS_SELECTOR, "table#audit tbody tr").text
        assert "alice" in row and "retry" in row and f"job {ids.failed_id}" in row
        browser.save_screenshot(str(tmp_path / "mounted-audit.png"))

        # Another user of the host reads only: no buttons, and the live part refreshes in place.
        browser.get(f"{base}/login?user=bob&next={MOUNT}/jobs/{ids.script_id}")
        wait_for(browser, "#job-live")
        assert browser.find_elements(By.CSS_SELECTOR, "#job-live button") == []
        assert browser.find_elements(By.CSS_SELECTOR, "form[method=post]") == []
        browser.get(inside)
        wait_for(browser, "table.queues")
        WebDriverWait(browser, 15).until(
            lambda d: "updated" in d.find_element(By.CSS_SELECTOR, "#live").text
        )
        assert browser.find_elements(By.CSS_SELECTOR, "table.queues button") == []
        assert [e for e in console_errors(browser) if "favicon.ico" not in e] == []
