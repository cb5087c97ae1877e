"""Enqueue jobs on the embedded SQLite default, process them, read the results.

    make demo        # or: .venv/bin/python examples/quickstart.py

The processing loop below uses the store's primitives (claim under a lease,
complete or fail with the lease token) to show what a worker does.
"""

from __future__ import annotations

import tempfile
import traceback
from datetime import timedelta
from pathlib import Path

from conveyor import App, JobFailed
from conveyor.job import encode_json, utcnow
from conveyor.store.base import Completion, Failure

folder = Path(tempfile.mkdtemp(prefix="conveyor-quickstart-"))
app = App(f"sqlite:///{folder / 'jobs.db'}")


@app.task(queue="math", max_attempts=2)
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="math", max_attempts=1)
def divide(a: int, b: int) -> float:
    return a / b


def process_all() -> None:
    """Claim ready jobs ten at a time, run each handler, record its outcome."""
    while jobs := app.store.job_claim(["math"], 10, "quickstart", timedelta(seconds=30), utcnow()):
        for job in jobs:
            assert job.lease_token is not None
            handler = app.get_task(job.task)
            try:
                result = handler(*job.args, **job.kwargs)
            except Exception:
                failure = Failure(job.id, job.lease_token, traceback.format_exc(), utcnow())
                app.store.job_fail([failure], utcnow())
            else:
                done = Completion(job.id, job.lease_token, encode_json("result", result))
                app.store.job_complete([done], utcnow())


sums = add.enqueue_many([((i, i), {}) for i in range(5)])
once = add.options(key="only-once").enqueue(40, 2)
again = add.options(key="only-once").enqueue(40, 2)  # same key: the same job comes back
broken = divide.enqueue(1, 0)
process_all()

print("sums:", [job.wait(timeout=5) for job in sums])
print("keyed job:", once.id, "==", again.id, "->", once.wait(timeout=5))
try:
    broken.wait(timeout=5)
except JobFailed as exc:
    print("divide failed:", (exc.error or "").strip().splitlines()[-1])
print("history of job", broken.id, [event.kind for event in app.events(broken.id)])
print("stats:", {q: s.counts for q, s in app.stats().queues.items()})
print("database:", folder / "jobs.db")
app.close()
