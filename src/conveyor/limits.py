"""Flow control: the rules of rate and concurrency limits (no I/O).

A queue may have two limits, both stored in the database and obeyed by every
worker of every process at the moment it claims:

- the queue's own limit, on all its jobs together;
- a per-key limit, applied separately to each value of the jobs' ``limit_key``
  (an enqueue option), e.g. one request per second per customer. Jobs without
  a ``limit_key`` are not held by it (the queue's own limit still applies).

Each limit has a rate (at most ``count`` jobs started in any window of ``per``
seconds: a sliding window, so ``"10/s"`` never lets an eleventh job start
within one second of the first, and ``"600/m"`` allows a burst of 600), a
concurrency (at most that many running at once), or both.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from conveyor.errors import ConfigurationError

#: Most jobs one rate may let start in its window: the claim counts the starts
#: of the current window, so a window's count is what one claim reads.
MAX_RATE_COUNT = 1_000_000
#: Longest rate window, and longest throttle, in seconds.
MAX_RATE_WINDOW = 86_400.0
MAX_THROTTLE = 7 * 86_400.0
MAX_CONCURRENCY = 2**31 - 1

_UNITS = {
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``count`` jobs started in any ``per`` seconds."""

    count: int
    per: float

    def __str__(self) -> str:
        for unit, seconds in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.per == seconds:
                return f"{self.count}/{unit}"
        for unit, seconds in (("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            amount = self.per / seconds
            if amount >= 1 and amount == int(amount):
                return f"{self.count}/{int(amount)}{unit}"
        return f"{self.count}/{self.per:g}s"


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: a rate, a concurrency, or both."""

    rate: Rate | None = None
    concurrency: int | None = None

    def __str__(self) -> str:
        """``20/s, 3 at once``."""
        parts = []
        if self.rate is not None:
            parts.append(str(self.rate))
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        return ", ".join(parts) or "none"


def window_words(per: float) -> str:
    """A rate's window as people say it: ``second``, ``minute``, ``10 seconds``, ``2 hours``."""
    for unit, seconds in (("day", 86400.0), ("hour", 3600.0), ("minute", 60.0), ("second", 1.0)):
        amount = per / seconds
        if amount >= 1 and amount == int(amount):
            return unit if amount == 1 else f"{int(amount)} {unit}s"
    return f"{per:g} seconds"


def fullness_words(limit: Limit | None, running: int, started: int) -> list[str]:
    """How full a limit is, in words: ``2 running; limit 3``, ``6 started in the last
    minute; limit 1`` (one part per bound the limit sets)."""
    parts = []
    if limit is not None and limit.concurrency is not None:
        parts.append(f"{running:,} running; limit {limit.concurrency:,}")
    if limit is not None and limit.rate is not None:
        parts.append(
            f"{started:,} started in the last {window_words(limit.rate.per)}; "
            f"limit {limit.rate.count:,}"
        )
    return parts


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """What is stored for a queue: its own limit, its per-key limit, its throttle."""

    queue: str
    limit: Limit | None = None
    key_limit: Limit | None = None
    #: ``throttle`` (``ctx.throttle``) holds the whole queue back until then.
    throttled_until: datetime | None = None


def parse_rate(value: str | Rate) -> Rate:
    """``"10/s"``, ``"600/m"``, ``"1000/h"``, ``"5/10s"`` (5 in any 10 seconds) or a Rate."""
    if isinstance(value, Rate):
        return check_rate(value)
    if not isinstance(value, str):
        raise ConfigurationError(
            f"rate must be text such as '10/s', '600/m' or '1000/h', got {type(value).__name__}"
        )
    match = _RATE.match(value.lower())
    if match is None or match.group(3) not in _UNITS:
        raise ConfigurationError(
            f"cannot read rate {value!r}: write a count per unit, such as '10/s', '600/m', "
            "'1000/h' or '5/10s' (at most 5 jobs started in any 10 seconds)"
        )
    count, amount, unit = match.groups()
    per = float(amount or 1) * _UNITS[unit]
    return check_rate(Rate(int(count), per))


def check_rate(rate: Rate) -> Rate:
    if isinstance(rate.count, bool) or not isinstance(rate.count, int):
        raise ConfigurationError(f"a rate's count must be an integer, got {rate.count!r}")
    if not 1 <= rate.count <= MAX_RATE_COUNT:
        raise ConfigurationError(
            f"a rate lets 1 to {MAX_RATE_COUNT:,} jobs start per window, got {rate.count}"
        )
    if not math.isfinite(rate.per) or not 0.001 <= rate.per <= MAX_RATE_WINDOW:
        raise ConfigurationError(
            f"a rate's window must be from 1 ms to one day, got {rate.per:g} seconds"
        )
    return rate


def check_concurrency(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"concurrency must be an integer, got {value!r}")
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ConfigurationError(
            f"concurrency must be from 1 to {MAX_CONCURRENCY:,} (to stop a queue, pause it), "
            f"got {value}"
        )
    return value


def make_limit(rate: str | Rate | None, concurrency: int | None) -> Limit | None:
    """The limit of ``app.limit``'s arguments; None when neither is given (no limit)."""
    if rate is None and concurrency is None:
        return None
    return Limit(
        rate=None if rate is None else parse_rate(rate),
        concurrency=None if concurrency is None else check_concurrency(concurrency),
    )


def throttle_seconds(value: object, *, allow_zero: bool = False) -> float:
    """A throttle's length in seconds (a number or a timedelta), checked."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    low = "0" if allow_zero else "more than 0"
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not allow_zero)
        or seconds > MAX_THROTTLE
    ):
        raise ConfigurationError(
            f"a throttle lasts {low} and at most {MAX_THROTTLE:g} seconds (a week), got {value!r}"
        )
    return float(seconds)
