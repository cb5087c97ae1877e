"""In a real headless Chromium: the job page says why, the limits page lists throttled keys,
each lifted by its own button after a question; nothing scrolls sideways, no word breaks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from conveyor import App
from conveyor.job import utcnow
from dashboard_seed import Seeded
from dashboard_server import serve
from test_dashboard_browser import (  # the same browser and checks as the other pages
    BROKEN_WORDS,
    LONG_QUEUE,
    LONG_TASK,
    PHONE_WIDTH,
    browser,
    console_errors,
    live_text,
    notice_text,
    seeded,
    shoot,
    wait_for,
)

__all__ = ["browser", "seeded", "shoot"]  # fixtures, used by name

LONG_KEY = "customer-with-a-long-key-42-of-the-partner-in-the-north"


def test_why_and_throttled_keys_in_the_browser(
    browser: WebDriver, seeded: tuple[App, Seeded], shoot: Callable[[str], Path]
) -> None:
    app, _ = seeded
    job = app.enqueue(LONG_TASK, [1], queue=LONG_QUEUE, limit_key=LONG_KEY)
    app.enqueue(LONG_TASK, [2], queue=LONG_QUEUE, limit_key="c-2")
    app.throttle(LONG_QUEUE, 600, limit_key=LONG_KEY)
    app.throttle(LONG_QUEUE, 900, limit_key="c-2")
    app.store.worker_register("w-long", "host", 1, [LONG_QUEUE], 4, utcnow())
    pages = [f"/jobs/{job.id}", f"/limits/{LONG_QUEUE}"]
    try:
        with serve(app) as base:
            for width, mobile in ((1366, False), (PHONE_WIDTH, True)):
                browser.execute_cdp_cmd(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile},
                )
                for path in pages:
                    browser.get(base + path)
                    wait_for(browser, "main .panel")
                    assert browser.execute_script(BROKEN_WORDS) == [], (width, path)
                    scroll = browser.execute_script("return document.documentElement.scrollWidth")
                    assert scroll <= width, (width, path, scroll)
                    shoot(f"why-{width}-{pages.index(path)}")
            browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
            browser.get(base + pages[0])
            wait_for(browser, "#job-why")
            why = live_text(browser, "#job-why")
            assert f"limit key '{LONG_KEY}' of queue '{LONG_QUEUE}' is throttled until" in why

            browser.get(base + pages[1])
            wait_for(browser, "#throttled-keys")
            rows = browser.find_elements(By.CSS_SELECTOR, "#throttled-keys tbody tr")
            assert [r.find_element(By.CSS_SELECTOR, "td").text for r in rows] == [LONG_KEY, "c-2"]
            rows[0].find_element(By.XPATH, ".//button[text()='Lift']").click()
            alert = browser.switch_to.alert
            assert f"Lift the throttle of key {LONG_KEY} now?" in alert.text
            alert.accept()
            assert notice_text(browser).startswith("Throttle lifted")
            left = app.store.limit_throttled_keys(utcnow(), 10, LONG_QUEUE)
            assert [t.limit_key for t in left] == ["c-2"]
            browser.get(base + pages[0])
            wait_for(browser, "main .panel")
            assert "throttled" not in live_text(browser, "#job-why")
            assert console_errors(browser) == []
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
