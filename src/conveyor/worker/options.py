"""A worker's settings, as ``app.worker(...)`` checked them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerOptions:
    queues: tuple[str, ...]
    concurrency: int = 8
    burst: bool = False
    stop_timeout: float = 30.0
    lease: float = 30.0
    #: Longest sleep without a wake: a missed signal delays work by at most this.
    poll_interval: float = 1.0
    #: Run the rescuer, retention and periodic tasks (one leader at a time).
    maintenance: bool = True
    #: Jobs claimed beyond the free slots, held (leased) until a slot frees:
    #: fewer claims per job at a low concurrency, at the price of jobs that wait
    #: here while other workers could have run them. Off (0) by default.
    prefetch: int = 0
