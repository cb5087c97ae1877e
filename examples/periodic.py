"""A periodic job: the workers enqueue it on a schedule, once per tick, however many run.

    python examples/periodic.py

``@app.periodic(every=...)`` or ``@app.periodic(cron="...")`` (in UTC) declares
a task that the workers' maintenance enqueues at each tick. Each tick is taken
in the store, in the transaction that enqueues its job, so two workers (or a
restart) never enqueue it twice. A schedule that has never ticked in this
store starts with its latest tick: ``nightly_report`` runs at once, for the
last 03:00. This example runs a worker for a few seconds and shows the ticks
it enqueued.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from conveyor import App

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db


@app.periodic(every=timedelta(seconds=1), queue="clock")
def tick() -> str:
    return datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]


@app.periodic(cron="0 3 * * *", queue="clock")  # every day at 03:00 UTC
def nightly_report() -> str:
    return "report written"


def main() -> None:
    # Maintenance runs every quarter of the lease (at most every 5 s); a short
    # lease makes it look every half second here.
    with app.worker(queues=["clock"], lease=2.0):
        time.sleep(2.5)

    ticks = [job for job in app.jobs(task="tick", limit=100) if job.state == "succeeded"]
    print(f"tick ran {len(ticks)} times:")
    for job in reversed(ticks[:5]):
        print(f"  job {job.id} {job.key} ran at {job.result}")
    nightly = app.jobs(task="nightly_report", limit=10)
    print("nightly_report:", ", ".join(f"job {job.id} {job.key} {job.state}" for job in nightly))


if __name__ == "__main__":
    try:
        main()
    finally:
        app.close()
