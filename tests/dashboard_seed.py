"""A small database that looks like a day of work, for the dashboard's tests.

Jobs are moved through the real store calls (claim, complete, fail, progress),
so what the pages show is what workers would have written.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import timedelta

from conveyor import App
from conveyor.job import utcnow
from conveyor.store.records import Finish, Lease
from outcomes import Failure

#: Arguments that would run as script if a page failed to escape them.
SCRIPT_PAYLOAD = "<script>window.__pwned = 1; document.title = 'pwned';</script>"


@dataclass(frozen=True)
class Seeded:
    failed_id: int
    script_id: int
    running_id: int
    succeeded_id: int


def traceback_of(exc: Exception) -> str:
    try:
        raise exc
    except Exception:
        return traceback.format_exc()


def seed(app: App) -> Seeded:
    store = app.store
    for n in range(4):
        app.enqueue("mail.send", [f"user{n}@example.com"], {"template": "welcome"}, queue="mail")
    app.enqueue("reports.build", [2026, 11], {"format": "pdf"}, queue="reports", max_attempts=1)
    app.enqueue("reports.render", ["q4"], queue="reports", max_attempts=1)
    script = app.enqueue("render.page", [SCRIPT_PAYLOAD], {"title": SCRIPT_PAYLOAD}, queue="web")
    app.enqueue("thumbs.make", ["photo.jpg"], queue="media", batch="album-7")
    now = utcnow()  # after the enqueues: their run_at must not lie in the future

    mail = store.job_claim(["mail"], 2, "worker-a", timedelta(seconds=30), now)
    store.job_finish(
        [Finish.complete(j.id, j.lease_token or "", '{"sent": true}') for j in mail], now
    )
    reports = store.job_claim(["reports"], 2, "worker-b", timedelta(seconds=30), now)
    failing, running = sorted(reports, key=lambda j: j.id)
    error = traceback_of(ConnectionError("SMTP relay refused the connection: 421 try later"))
    store.job_finish(
        [Failure(failing.id, failing.lease_token or "", error, now + timedelta(seconds=5))], now
    )
    store.job_progress(Lease(running.id, running.lease_token or ""), 0.4, "page 4 of 10", now)
    store.worker_register("worker-b", "build-01", 4242, ["reports"], 4, now)
    store.worker_beat("worker-b", 1, now)
    return Seeded(
        failed_id=failing.id, script_id=script.id, running_id=running.id, succeeded_id=mail[0].id
    )
