"""The dashboard in a real headless Chromium (Debian's chromium and chromedriver).

Each test serves a seeded database with uvicorn and drives the pages the way
an operator would; screenshots of every page land in the test's tmp_path.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from conveyor import App
from conveyor.job import JobState
from dashboard_seed import SCRIPT_PAYLOAD, Seeded, seed
from dashboard_server import serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("chromium and chromedriver are needed: run `make ensure-chromium`")
    options = Options()
    options.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1360,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[tuple[App, Seeded]]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as app:
        app.migrate()
        yield app, seed(app)


@pytest.fixture
def shoot(browser: WebDriver, tmp_path: Path) -> Callable[[str], Path]:
    fresh(browser)

    def save(name: str) -> Path:
        path = tmp_path / f"{name}.png"
        assert browser.save_screenshot(str(path)), f"no screenshot of {name}"
        return path

    return save


def fresh(browser: WebDriver) -> None:
    """Leave the previous test's page (its refresh timer must not log into this test)."""
    browser.get("about:blank")
    console_errors(browser)


def console_errors(browser: WebDriver) -> list[str]:
    """Severe console messages since the last call (a CSP violation is one)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(browser: WebDriver, css: str, timeout: float = 10) -> None:
    WebDriverWait(browser, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))


def test_overview_shows_the_queues_and_workers(
    browser: WebDriver, dsn: str, shoot: Callable[[str], Path]
) -> None:
    with App(dsn) as app:
        app.migrate()
        seed(app)
        with serve(app) as base:
            browser.get(base + "/")
            wait_for(browser, "table.queues")
            shoot("overview")
            rows = browser.find_elements(By.CSS_SELECTOR, "table.queues tbody tr")
            names = [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows]
            assert names == ["mail", "media", "reports", "web"]
            reports = rows[names.index("reports")].text
            assert "1" in reports.split()  # one failed, one running
            workers = browser.find_element(By.XPATH, "//h2[text()='Workers']/..").text
            assert "build-01" in workers and "4242" in workers
            # The chart of the last hour has bars for the jobs that finished.
            assert browser.find_elements(By.CSS_SELECTOR, "svg.chart rect.bar-succeeded")
            assert browser.find_elements(By.CSS_SELECTOR, "svg.chart rect.bar-failed")
            assert console_errors(browser) == []


def test_failed_job_traceback_and_retry(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    with serve(app) as base:
        browser.get(base + "/")
        browser.find_element(By.LINK_TEXT, "Failed").click()
        wait_for(browser, "table.jobs")
        shoot("failed-list")
        rows = browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr")
        assert [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows] == [str(ids.failed_id)]
        assert "ConnectionError: SMTP relay refused" in rows[0].text

        rows[0].find_element(By.CSS_SELECTOR, "td a").click()
        wait_for(browser, "#job-error")
        shoot("failed-job")
        error = browser.find_element(By.ID, "job-error").text
        assert error.startswith("Traceback (most recent call last):")
        assert "ConnectionError: SMTP relay refused the connection: 421 try later" in error
        history = browser.find_element(By.CSS_SELECTOR, "table.events").text
        assert "enqueued" in history and "claimed" in history and "worker-b" in history

        browser.find_element(By.XPATH, "//button[text()='Retry']").click()
        wait_for(browser, ".notice")
        shoot("retried-job")
        assert browser.find_element(By.CSS_SELECTOR, ".notice").text == "Job queued again."
        assert browser.find_element(By.CSS_SELECTOR, "h1 .badge").text == "queued"
        assert app.get(ids.failed_id).state == JobState.QUEUED
        assert console_errors(browser) == []


def test_post_without_csrf_token_is_refused(browser: WebDriver, seeded: tuple[App, Seeded]) -> None:
    app, ids = seeded
    with serve(app) as base:
        browser.get(f"{base}/jobs/{ids.failed_id}")
        wait_for(browser, "#job-error")
        # Same origin, cookies and all, but no form token: what a forged form sends.
        status = browser.execute_async_script(
            """
            const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: "POST", body: new URLSearchParams({x: "1"})})
              .then(r => done(r.status), e => done(String(e)));
            """,
            f"{base}/jobs/{ids.failed_id}/retry",
        )
        assert status == 403
        assert app.get(ids.failed_id).state == JobState.FAILED


def test_script_in_job_arguments_is_shown_not_run(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    with serve(app) as base:
        browser.get(f"{base}/jobs/{ids.script_id}")
        wait_for(browser, "#job-args")
        shoot("script-job")
        assert browser.execute_script("return window.__pwned") is None
        assert "pwned" not in browser.title
        assert SCRIPT_PAYLOAD in browser.find_element(By.ID, "job-args").text
        assert SCRIPT_PAYLOAD in browser.find_element(By.ID, "job-kwargs").text
        browser.get(f"{base}/jobs?queue=web")
        wait_for(browser, "table.jobs")
        assert browser.execute_script("return window.__pwned") is None
        assert "pwned" not in browser.title


def test_overview_updates_itself(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    with serve(app) as base:
        browser.get(base + "/")
        wait_for(browser, "table.queues")
        assert "billing" not in browser.find_element(By.CSS_SELECTOR, "table.queues").text
        marker = browser.execute_script("return window.performance.timeOrigin")
        app.enqueue("invoice.send", [1], queue="billing")
        # No reload: live.js fetches the fragment every few seconds and swaps it in.
        WebDriverWait(browser, 15).until(
            lambda d: "billing" in d.find_element(By.CSS_SELECTOR, "table.queues").text
        )
        assert browser.execute_script("return window.performance.timeOrigin") == marker
        shoot("overview-refreshed")
        assert console_errors(browser) == []


def test_jobs_page_pages_with_keyset_links(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    for n in range(120):
        app.enqueue("bulk.item", [n], queue="bulk")
    with serve(app) as base:
        browser.get(base + "/jobs?queue=bulk")
        wait_for(browser, "table.jobs")
        shoot("jobs-bulk")
        seen: list[int] = []
        started = time.monotonic()
        while True:
            cells = browser.find_elements(By.CSS_SELECTOR, "table.jobs tbody tr td:first-child")
            seen += [int(c.text) for c in cells]
            older = browser.find_elements(By.LINK_TEXT, "Older »")
            if not older:
                break
            older[0].click()
            assert time.monotonic() - started < 30
        assert len(seen) == 120 and seen == sorted(seen, reverse=True)


def test_token_login_sets_a_cookie_the_browser_sends_back(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    with serve(app, token="tok-123") as base:
        browser.get(base + "/jobs")
        assert "needs its token" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(base + "/jobs?state=failed&token=tok-123")
        wait_for(browser, "table.jobs")
        assert browser.current_url == base + "/jobs?state=failed"  # the token left the address
        browser.find_element(By.LINK_TEXT, str(ids.failed_id)).click()
        wait_for(browser, "#job-error")
        browser.find_element(By.XPATH, "//button[text()='Retry']").click()
        wait_for(browser, ".notice")
        shoot("retried-with-token")
        assert app.get(ids.failed_id).state == JobState.QUEUED
        browser.delete_all_cookies()
