"""Backoff policies: how long a failed attempt waits before the next one."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from conveyor.errors import ConfigurationError


class Backoff(Protocol):
    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first)."""
        ...


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """``base * factor ** (attempt - 1)``, capped at ``maximum``, with +/- ``jitter`` spread.

    Jitter spreads retries of jobs that failed together (an outage) so they do
    not all hit the recovered service in the same instant.
    """

    base: float = 1.0
    factor: float = 2.0
    maximum: float = 3600.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.maximum < 0 or not 0 <= self.jitter <= 1:
            raise ConfigurationError(
                "ExponentialBackoff needs base >= 0, factor >= 1, maximum >= 0, 0 <= jitter <= 1"
            )

    def delay(self, attempt: int) -> float:
        exponent = max(attempt - 1, 0)
        # Cap the exponent first: factor ** 2000 overflows a float.
        raw = (
            self.maximum if exponent > 64 else min(self.base * self.factor**exponent, self.maximum)
        )
        spread = raw * self.jitter
        return max(0.0, raw + random.uniform(-spread, spread))


@dataclass(frozen=True, slots=True)
class FixedBackoff:
    """The same delay after every failed attempt."""

    seconds: float | timedelta = 5.0

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"FixedBackoff needs seconds or a timedelta, got {self.seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigurationError(
                f"FixedBackoff needs a finite delay >= 0, got {self.seconds!r}"
            )
        object.__setattr__(self, "seconds", float(seconds))

    def delay(self, attempt: int) -> float:
        assert isinstance(self.seconds, float)  # made so by __post_init__
        return self.seconds


DEFAULT_BACKOFF: Backoff = ExponentialBackoff()


def check_backoff(backoff: object) -> Backoff:
    """Refuse, when a task is declared, a backoff that could not schedule a retry."""
    delay = getattr(backoff, "delay", None)
    if not callable(delay):
        raise TypeError(f"backoff must have a delay(attempt) method, got {backoff!r}")
    for attempt in (1, 2, 3, 50):
        seconds = delay(attempt)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(
                f"backoff {backoff!r}.delay({attempt}) returned {seconds!r}; "
                "it must return a number of seconds"
            )
        if not math.isfinite(seconds) or seconds < 0 or seconds > 10 * 365 * 86400:
            raise ConfigurationError(
                f"backoff {backoff!r}.delay({attempt}) returned {seconds!r}; "
                "it must be a finite number of seconds from 0 to ten years"
            )
    return backoff  # type: ignore[return-value]
