"""The tasks of ``conveyor demo``, run by ``conveyor worker conveyor.cli.demo_tasks:app``.

Three queues with the kinds of work a real application hands to a queue:

- ``images``: many quick jobs (a thumbnail: a little hashing);
- ``reports``: a few slow jobs that report their progress as they go;
- ``integrations``: calls to partners that fail once and succeed on retry,
  card charges that are declined for good, the ordered updates of one device
  (a group: one at a time, in order), reminders deferred by an hour (scheduled),
  and rate fetches whose first attempt fails and whose next waits 15 minutes
  (retrying).

``app`` is built on first access from ``$CONVEYOR_DSN``, so importing this
module opens no database by itself.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from conveyor import App, Context, Fail, FixedBackoff

#: How long a deferred reminder waits: longer than the demo, so it is still queued at the end.
REMINDER_DELAY = 3600.0
#: The backoff of a rate fetch after its first attempt fails: it is still retrying at the end.
RATES_BACKOFF = 900.0


def register(app: App) -> App:
    """Register the demo's handlers on ``app``."""

    @app.task(queue="images")
    def thumbnail(image_id: int, size: int = 128) -> dict[str, Any]:
        digest = hashlib.sha256(f"{image_id}:{size}".encode()).hexdigest()
        return {"image": image_id, "size": size, "etag": digest[:12]}

    @app.task(queue="reports", max_attempts=3)
    def render_report(ctx: Context, report_id: int, seconds: float) -> dict[str, Any]:
        steps = 10
        for step in range(steps):
            if ctx.cancelled.is_set():
                raise Fail(f"report {report_id} cancelled")
            time.sleep(seconds / steps)
            ctx.progress((step + 1) / steps, f"page {step + 1} of {steps}")
        return {"report": report_id, "pages": steps}

    # A partner API that times out on the first call and answers the second.
    @app.task(queue="integrations", max_attempts=4, backoff=FixedBackoff(0.5))
    def call_partner(ctx: Context, request_id: int) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise TimeoutError(f"partner did not answer request {request_id} in time")
        return {"request": request_id, "status": "accepted", "attempt": ctx.attempt}

    # Declined for good: retrying cannot help, but it is tried twice to show the backoff.
    @app.task(queue="integrations", max_attempts=2, backoff=FixedBackoff(0.3))
    def charge_card(customer: str, cents: int) -> None:
        raise ValueError(f"card of customer {customer} declined for {cents / 100:.2f} EUR")

    @app.task(queue="integrations")
    def sync_device(device: str, seq: int) -> dict[str, Any]:
        time.sleep(0.002)
        return {"device": device, "seq": seq}

    @app.task(queue="integrations")
    def send_reminder(user: str) -> str:
        return f"reminded {user}"

    # A rates service that is down: the first attempt fails, the next is 15 minutes away.
    @app.task(queue="integrations", max_attempts=3, backoff=FixedBackoff(RATES_BACKOFF))
    def fetch_rates(ctx: Context, currency: str) -> dict[str, Any]:
        if ctx.attempt == 1:
            raise ConnectionError(f"rates service unreachable for {currency}")
        return {"currency": currency, "rate": 1.0}

    return app


_app: App | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = register(App())
        return _app
    raise AttributeError(name)
