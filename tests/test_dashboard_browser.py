"""The dashboard in a real headless Chromium (Debian's chromium and chromedriver).

Each test serves a seeded database with uvicorn and drives the pages the way
an operator would; screenshots of every page land in the test's tmp_path.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

import conveyor.web.server
from conveyor import App
from conveyor.job import JobState, utcnow
from conveyor.store.records import Finish, Lease
from dashboard_seed import SCRIPT_PAYLOAD, Seeded, seed
from dashboard_server import serve
from outcomes import Failure, record_tick

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


@contextmanager
def at_width(browser: WebDriver, width: int) -> Iterator[None]:
    """The window ``width`` px wide (a phone's below 500) for the block, then as before."""
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 500},
    )
    try:
        yield
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def console_errors(browser: WebDriver) -> list[str]:
    """Severe console messages since the last call (a CSP violation is one)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(browser: WebDriver, css: str, timeout: float = 10) -> None:
    WebDriverWait(browser, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))


def live_text(browser: WebDriver, css: str) -> str:
    """The text of the first element matching css, read in one step inside the page.

    The live pages swap their fragments in every few seconds: an element found
    first and read after may already be gone (a stale element).
    """
    text = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';", css
    )
    return str(text)


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
            workers = browser.find_element(By.XPATH, "//h2[text()='Workers']/../..").text
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
        assert browser.find_element(By.CSS_SELECTOR, "h1 .badge").text == "ready"
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
        assert "billing" not in live_text(browser, "table.queues")
        marker = browser.execute_script("return window.performance.timeOrigin")
        app.enqueue("invoice.send", [1], queue="billing")
        # No reload: live.js fetches the fragment every few seconds and swaps it in.
        WebDriverWait(browser, 15).until(lambda d: "billing" in live_text(d, "table.queues"))
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


# --- operators' views and actions ----------------------------------------------------------------

PHONE_WIDTH = 375


@pytest.fixture
def quick_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Live parts refreshed every second instead of five, so waiting for one stays short."""
    monkeypatch.setattr(conveyor.web.server, "REFRESH_SECONDS", 1)


def failed_jobs(app: App, queue: str, n: int, error: str = "ValueError: refused") -> list[int]:
    ids = [app.enqueue("send", [i], queue=queue, max_attempts=1).id for i in range(n)]
    now = utcnow()
    for job in app.store.job_claim([queue], n, "w", timedelta(seconds=30), now):
        app.store.job_finish([Failure(job.id, job.lease_token or "", error, now)], now)
    return ids


def notice_text(browser: WebDriver) -> str:
    wait_for(browser, ".notice")
    return str(browser.find_element(By.CSS_SELECTOR, ".notice").text)


def test_usable_at_375_pixels_and_dark_when_the_system_is(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    retried = failed_jobs(app, "billing", 1)[0]
    app.retry(retried)
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": PHONE_WIDTH, "height": 812, "deviceScaleFactor": 1, "mobile": True},
    )
    try:
        with serve(app) as base:
            for name, path in (
                ("phone-overview", "/"),
                ("phone-jobs", "/jobs"),
                ("phone-job", f"/jobs/{ids.running_id}"),
                ("phone-workers", "/workers"),
            ):
                browser.get(base + path)
                wait_for(browser, "main .panel")
                shoot(name)
                width = browser.execute_script("return document.documentElement.scrollWidth")
                assert width <= PHONE_WIDTH, (path, width)
                # Every button and link to act with lies on the screen, not off its edge.
                off = browser.execute_script(
                    """
                    return [...document.querySelectorAll("main button, main a.button")]
                      .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
                      .map(e => e.textContent);
                    """
                )
                assert off == [], (path, off)
            browser.execute_cdp_cmd(
                "Emulation.setEmulatedMedia",
                {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
            )
            browser.get(base + "/")
            wait_for(browser, "table.queues")
            shoot("phone-overview-dark")
            background = browser.execute_script(
                "return getComputedStyle(document.body).backgroundColor"
            )
            assert background == "rgb(18, 21, 28)"
            assert console_errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_tick_jobs_in_a_list_and_retry_or_delete_them(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    mail = failed_jobs(app, "outbox", 3)
    with serve(app) as base:
        browser.get(base + "/jobs?state=failed&queue=outbox")
        wait_for(browser, "table.jobs")
        for job_id in mail[:2]:
            browser.find_element(By.CSS_SELECTOR, f"input[name=id][value='{job_id}']").click()
        shoot("ticked")
        browser.find_element(By.CSS_SELECTOR, "button[value=retry]").click()
        assert notice_text(browser) == "Jobs queued again: 2."
        assert [app.get(i).state for i in mail] == [JobState.QUEUED] * 2 + [JobState.FAILED]
        # The header box ticks every job shown; Delete asks first.
        browser.get(base + "/jobs?queue=outbox")
        wait_for(browser, "input[data-select-all]")
        browser.find_element(By.CSS_SELECTOR, "input[data-select-all]").click()
        ticked = browser.find_elements(By.CSS_SELECTOR, "input[name=id]:checked")
        assert len(ticked) == 3
        browser.find_element(By.CSS_SELECTOR, "button[value=delete]").click()
        alert = browser.switch_to.alert
        assert "Delete the ticked jobs" in alert.text
        alert.accept()
        assert notice_text(browser) == "Jobs deleted: 3."
        assert app.jobs(queue="outbox") == []
        assert console_errors(browser) == []


def test_act_on_every_matching_job_after_seeing_the_count(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    timeouts = failed_jobs(app, "outbox", 3, "TimeoutError: relay slow")
    failed_jobs(app, "outbox", 2, "ValueError: refused")
    with serve(app) as base:
        browser.get(base + "/jobs?state=failed&error=timeout")
        wait_for(browser, "table.jobs")
        browser.find_element(By.LINK_TEXT, "Retry…").click()
        wait_for(browser, "#confirm-count")
        shoot("confirm-retry")
        assert browser.find_element(By.ID, "confirm-count").text.startswith(
            "3 of them will be queued again"
        )
        browser.find_element(By.XPATH, "//button[text()='Retry 3 job(s)']").click()
        assert notice_text(browser) == "Jobs queued again: 3."
        assert sorted(j.id for j in app.jobs(state="ready", queue="outbox")) == timeouts


def test_job_page_and_job_list_update_live(
    browser: WebDriver,
    seeded: tuple[App, Seeded],
    shoot: Callable[[str], Path],
    quick_refresh: None,
) -> None:
    app, ids = seeded
    running = app.get(ids.running_id)
    lease = Lease(running.id, running.lease_token or "")
    with serve(app) as base:
        browser.get(f"{base}/jobs/{running.id}")
        wait_for(browser, "#job-progress")
        assert "40 %" in browser.find_element(By.ID, "job-progress").text
        marker = browser.execute_script("return window.performance.timeOrigin")
        app.store.job_progress(lease, 0.7, "page 7 of 10", utcnow())
        WebDriverWait(browser, 10).until(lambda d: "70 %" in live_text(d, "#job-progress"))
        app.store.job_finish([Finish.complete(running.id, lease.token, '"done"')], utcnow())
        WebDriverWait(browser, 10).until(lambda d: live_text(d, "h1 .badge") == "succeeded")
        assert '"done"' in browser.find_element(By.ID, "job-result").text
        assert "succeeded" in browser.find_element(By.CSS_SELECTOR, "table.events").text
        assert browser.execute_script("return window.performance.timeOrigin") == marker
        shoot("job-live")

        browser.get(base + "/jobs?queue=live")
        wait_for(browser, ".pager")
        first = app.enqueue("t", [1], queue="live").id
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.LINK_TEXT, str(first)))
        # Ticked jobs hold the list still: what the user picked does not move under them.
        browser.find_element(By.CSS_SELECTOR, f"input[name=id][value='{first}']").click()
        second = app.enqueue("t", [2], queue="live").id
        WebDriverWait(browser, 10).until(
            lambda d: "paused while jobs are ticked" in live_text(d, ".live-note")
        )
        assert not browser.find_elements(By.LINK_TEXT, str(second))
        browser.find_element(By.CSS_SELECTOR, f"input[name=id][value='{first}']").click()
        WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.LINK_TEXT, str(second)))
        assert browser.execute_script("return window.performance.timeOrigin") != marker
        assert console_errors(browser) == []


def test_retrying_job_run_now_and_a_dead_workers_jobs_taken_back(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    job = app.enqueue("charge", [1], queue="billing", max_attempts=3)
    now = utcnow()
    (held,) = app.store.job_claim(["billing"], 1, "w", timedelta(seconds=30), now)
    later = now + timedelta(hours=1)
    app.store.job_finish([Failure(held.id, held.lease_token or "", "TimeoutError", later)], now)
    # worker-b (seeded, holding the running report) stopped checking in 45 seconds ago.
    app.store.worker_beat("worker-b", 1, now - timedelta(seconds=45))
    with serve(app) as base:
        browser.get(f"{base}/jobs?state=retrying")
        wait_for(browser, "table.jobs")
        browser.find_element(By.LINK_TEXT, str(job.id)).click()
        wait_for(browser, "#job-live h1")
        assert browser.find_element(By.CSS_SELECTOR, "h1 .badge").text == "retrying"
        shoot("retrying-job")
        browser.find_element(By.XPATH, "//button[text()='Run now']").click()
        assert notice_text(browser).startswith("Job made due now")
        assert browser.find_element(By.CSS_SELECTOR, "h1 .badge").text == "ready"

        browser.find_element(By.LINK_TEXT, "Workers").click()
        wait_for(browser, "article.worker.dead")
        shoot("workers-dead")
        dead = browser.find_element(By.CSS_SELECTOR, "article.worker.dead")
        assert "probably dead" in dead.text and str(ids.running_id) in dead.text
        dead.find_element(By.XPATH, ".//button[starts-with(text(), 'Take back')]").click()
        browser.switch_to.alert.accept()
        assert notice_text(browser).startswith("Running jobs taken back (queued again")
        # The seeded report has one attempt only: taken back, it fails for good.
        taken = app.get(ids.running_id)
        assert taken.state == JobState.FAILED
        assert taken.error == "worker lost: taken back by an operator"
        assert console_errors(browser) == []


def test_periodic_tasks_page(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded

    @app.periodic(every=timedelta(minutes=5))
    def refresh_cache() -> None: ...

    record_tick(app.store, "refresh_cache", utcnow() - timedelta(minutes=1))
    with serve(app) as base:
        browser.get(base + "/")
        browser.find_element(By.LINK_TEXT, "Periodic").click()
        wait_for(browser, "table.periodic")
        shoot("periodic")
        row = browser.find_element(By.CSS_SELECTOR, "table.periodic tbody tr").text
        assert "refresh_cache" in row and "every 5 min" in row
        assert "1 min" in row and "ago" in row and "in " in row


# --- no word broken, at every width ----------------------------------------------------------

#: For each table cell, the words (runs of non-space text) that the browser laid out
#: on more than one line: a name, number or header broken inside a word. Code blocks
#: (a traceback opened in the history) wrap to fit by design and are left out.
BROKEN_WORDS = """
const broken = [];
for (const cell of document.querySelectorAll("main table th, main table td")) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.parentElement.closest("pre")) continue;
    const re = /\\S+/g;
    let m;
    while ((m = re.exec(node.data)) !== null) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const lines = new Set([...range.getClientRects()]
        .filter(r => r.width > 0)
        .map(r => Math.round(r.top)));
      if (lines.size > 1) broken.push(m[0]);
    }
  }
}
return broken;
"""
LONG_QUEUE = "images-for-the-public-website-in-several-sizes"
LONG_TASK = "thumbnails.make_every_size_of_a_picture_for_the_gallery"
LONG_WORKER = "build-host-eu-west-1a.example.internal:4242:0a1b2c3d"


def test_no_word_breaks_at_1024_and_1366_pixels_nor_on_a_phone(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, ids = seeded
    for n in range(2):
        app.enqueue(LONG_TASK, [n], queue=LONG_QUEUE, limit_key="customer-with-a-long-key-42")
    app.limit(LONG_QUEUE, rate="600/m", concurrency=12)
    app.limit(LONG_QUEUE, rate="1/s", per_key=True)
    (held,) = app.store.job_claim([LONG_QUEUE], 1, LONG_WORKER, timedelta(seconds=30), utcnow())
    app.store.worker_register(LONG_WORKER, "build-host-eu-west-1a", 4242, [LONG_QUEUE], 8, utcnow())
    failed_jobs(app, "partner-payments-eu", 2, "requests.exceptions.ConnectionError: refused")
    pages = ["/", "/jobs", f"/jobs?queue={LONG_QUEUE}", "/workers", f"/jobs/{held.id}",
             f"/limits/{LONG_QUEUE}", f"/jobs/{ids.failed_id}"]  # fmt: skip
    try:
        with serve(app) as base:
            for width, mobile in ((1024, False), (1366, False), (1920, False), (PHONE_WIDTH, True)):
                browser.execute_cdp_cmd(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile},
                )
                for path in pages:
                    browser.get(base + path)
                    wait_for(browser, "main .panel")
                    assert browser.execute_script(BROKEN_WORDS) == [], (width, path)
                    # The page itself never scrolls sideways (a wide table scrolls in its panel).
                    scroll = browser.execute_script("return document.documentElement.scrollWidth")
                    assert scroll <= width, (width, path, scroll)
                    shoot(f"words-{width}-{pages.index(path)}")
            assert console_errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


CLEAR_BUTTON = '//button[text()="Clear the queue\'s limit"]'


def test_a_limit_set_and_cleared_in_the_browser_asks_first(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    with serve(app) as base:
        browser.get(base + "/")
        wait_for(browser, "table.queues")
        queues = "//table[contains(@class,'queues')]//tr[.//a[text()='mail']]"
        row = browser.find_element(By.XPATH, queues)
        row.find_element(By.LINK_TEXT, "Limit…").click()
        wait_for(browser, "#limit-status")
        browser.find_element(By.NAME, "rate").send_keys("6/m")
        browser.find_element(By.NAME, "concurrency").send_keys("1")
        browser.find_element(By.XPATH, "//button[text()='Set limit']").click()
        alert = browser.switch_to.alert
        assert "Set this limit on mail?" in alert.text
        alert.accept()
        assert notice_text(browser).startswith("Limit set")
        assert str(app.limits()["mail"].limit) == "6/m, 1 at once"
        full = browser.find_element(By.ID, "limit-full").text
        assert "0 running; limit 1" in full and "started in the last minute; limit 6" in full
        shoot("limit-set")
        browser.find_element(By.XPATH, CLEAR_BUTTON).click()
        browser.switch_to.alert.dismiss()  # asked, and declined: nothing changes
        assert str(app.limits()["mail"].limit) == "6/m, 1 at once"
        browser.find_element(By.XPATH, CLEAR_BUTTON).click()
        browser.switch_to.alert.accept()
        assert notice_text(browser).startswith("Limit cleared")
        assert "mail" not in app.limits()
        assert console_errors(browser) == []


def test_a_workflow_page_draws_its_graph_on_a_phone_and_in_the_dark(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    from conveyor import Workflow

    app, _ = seeded

    @app.task(name="build_nightly_report_section")
    def task() -> None:
        return None

    wf = Workflow("nightly-report", name="a nightly report with a long name")
    heads = wf.group(*[task.step() for _ in range(4)])
    joined = wf.add(task.step(), after=heads)
    wf.chain(task.step(), task.step(), after=[joined])
    run = wf.enqueue()
    try:
        with serve(app) as base:
            for width, mobile, scheme in ((1366, False, "light"), (PHONE_WIDTH, True, "dark")):
                browser.execute_cdp_cmd(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile},
                )
                browser.execute_cdp_cmd(
                    "Emulation.setEmulatedMedia",
                    {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
                )
                for name, path in (
                    ("workflow", "/workflows/nightly-report"),
                    ("workflows", "/workflows"),
                    ("workflow-job", f"/jobs/{run.jobs[4].id}"),
                ):
                    browser.get(base + path)
                    wait_for(browser, "main .panel")
                    shoot(f"{name}-{width}-{scheme}")
                    scroll = browser.execute_script("return document.documentElement.scrollWidth")
                    assert scroll <= width, (width, path, scroll)
                    assert browser.execute_script(BROKEN_WORDS) == [], (width, path)
                browser.get(base + "/workflows/nightly-report")
                wait_for(browser, "svg.graph")
                fills = browser.execute_script(
                    """
                    return [...document.querySelectorAll("svg.graph rect")]
                      .map(r => getComputedStyle(r).fill);
                    """
                )
                assert len(fills) == 7 and len(set(fills)) == 2  # queued heads, waiting rest
            assert console_errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
