"""The App the throughput benchmark's worker processes run (DSN from CONVEYOR_DSN)."""

from __future__ import annotations

import time

from conveyor import App

app = App()


@app.task(queue="bench")
def noop() -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@app.task(queue="latency")
def started() -> float:
    """Returns when the handler started (wall clock), to measure enqueue-to-start latency."""
    return time.time()
