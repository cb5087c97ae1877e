"""Waiting in tests for something that happens in another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Longest any condition in the tests may take to come true.
DEADLINE = 10.0


def wait_until(
    condition: Callable[[], T],
    timeout: float = DEADLINE,
    what: str = "condition met",
    interval: float = 0.005,
) -> T:
    """Poll ``condition`` until it is truthy; after ``timeout``, fail saying ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)
