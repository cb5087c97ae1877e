"""The worker runtime: claim loop, dispatch, leases, wakeups, drain, signals."""

from conveyor.context import CancelSignal, Context
from conveyor.worker.worker import Worker

__all__ = ["CancelSignal", "Context", "Worker"]
