"""``ctx.throttle()``: a handler slows its whole queue, or its limit key, for every worker."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.job import Job
from conveyor.logs import job_fields

if TYPE_CHECKING:
    from conveyor.app import App

log = logging.getLogger("conveyor.worker")


def throttle_job(app: App, job: Job, seconds: float, whole_queue: bool) -> datetime:
    """Hold back the job's limit key (its queue when it has none, or ``whole_queue``)."""
    key = None if whole_queue else job.limit_key
    until = app.throttle(job.queue, seconds, limit_key=key)
    what = f"queue {job.queue!r}" if key is None else f"key {key!r} of queue {job.queue!r}"
    log.warning("job %s throttled %s for %gs (until %s)", job.id, what, seconds,
                until.strftime("%H:%M:%S"), extra=job_fields(job))  # fmt: skip
    return until
