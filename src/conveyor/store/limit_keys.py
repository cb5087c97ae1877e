"""Reads of single limit keys: how full one key is, and which keys are throttled.

A capability beside ``FlowControlStore`` (whose ``limit_status`` only counts
keys): what "why isn't this job running" and the limits page need to name a
key. Each store implements it in a module of its own (``limit_keys.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

#: Most throttled keys one read returns (the limits page shows these, and a count).
MAX_THROTTLED_KEYS = 200


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """One limit key of a queue at one moment."""

    queue: str
    limit_key: str
    #: Running jobs of the key.
    running: int
    #: Jobs of the key started in its rate's window (0 when the key has no rate).
    started: int
    #: The key's throttle, while it lasts.
    throttled_until: datetime | None


@dataclass(frozen=True, slots=True)
class KeyThrottle:
    """A limit key held back by a throttle, and when that ends."""

    queue: str
    limit_key: str
    until: datetime


@runtime_checkable
class LimitKeyStore(Protocol):
    def limit_key_usage(self, queue: str, limit_key: str, now: datetime) -> KeyUsage:
        """How full one limit key of ``queue`` is now (zeros for a key not in use)."""
        ...

    def limit_throttled_keys(
        self, now: datetime, limit: int, queue: str | None = None
    ) -> list[KeyThrottle]:
        """Keys throttled now, of ``queue`` or of every queue, soonest end first (at most
        ``limit``)."""
        ...
