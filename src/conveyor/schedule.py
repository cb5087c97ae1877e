"""Schedules of periodic tasks: a fixed interval or a five-field cron string (UTC)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from conveyor.errors import ConfigurationError

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("weekday", 0, 6))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Every:
    """Ticks at whole multiples of ``interval`` since the Unix epoch, so every worker agrees."""

    interval: timedelta

    def __post_init__(self) -> None:
        if self.interval < timedelta(seconds=1):
            raise ConfigurationError("a periodic interval must be at least one second")

    def last_tick(self, now: datetime) -> datetime:
        ticks = (now - _EPOCH) // self.interval
        return _EPOCH + ticks * self.interval

    def next_tick(self, now: datetime) -> datetime:
        return self.last_tick(now) + self.interval


@dataclass(frozen=True)
class Cron:
    """``minute hour day month weekday`` with ``*``, ``a-b``, ``a,b`` and ``/step``; in UTC.

    Weekday 0 is Sunday (7 is accepted too). As in cron, when both day and
    weekday are restricted, a time matches if either does.
    """

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        parts = expression.split()
        if len(parts) != 5:
            raise ConfigurationError(
                f"cron {expression!r} needs 5 fields: minute hour day month weekday"
            )
        sets = []
        for text, (name, low, high) in zip(parts, _FIELDS, strict=True):
            top = 7 if name == "weekday" else high
            values = _parse_field(text, name, low, top, expression)
            if name == "weekday":
                values = {v % 7 for v in values}
            sets.append(frozenset(values))
        minutes, hours, days, months, weekdays = sets
        return cls(
            expression, minutes, hours, days, months, weekdays,
            any_day=parts[2] == "*", any_weekday=parts[4] == "*",
        )  # fmt: skip

    def matches(self, when: datetime) -> bool:
        if when.minute not in self.minutes or when.hour not in self.hours:
            return False
        if when.month not in self.months:
            return False
        day_ok = when.day in self.days
        weekday_ok = (when.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day_ok and weekday_ok
        return day_ok or weekday_ok

    def last_tick(self, now: datetime) -> datetime:
        """The latest matching minute at or before ``now`` (searching back up to a year)."""
        when = now.astimezone(UTC).replace(second=0, microsecond=0)
        for _ in range(366 * 24 * 60):
            if self.matches(when):
                return when
            when -= timedelta(minutes=1)
        raise ConfigurationError(f"cron {self.expression!r} never matches")

    def next_tick(self, now: datetime) -> datetime:
        when = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        for _ in range(366 * 24 * 60):
            if self.matches(when):
                return when
            when += timedelta(minutes=1)
        raise ConfigurationError(f"cron {self.expression!r} never matches")


def _parse_field(text: str, name: str, low: int, high: int, expression: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if base == "*":
                start, stop = low, high
            elif "-" in base:
                first, last = base.split("-", 1)
                start, stop = int(first), int(last)
            else:
                start = stop = int(base)
                if step_text:
                    stop = high
        except ValueError:
            raise ConfigurationError(f"cron {expression!r}: bad {name} field {text!r}") from None
        if step < 1 or not low <= start <= stop <= high:
            raise ConfigurationError(
                f"cron {expression!r}: {name} field {text!r} is outside {low}-{high}"
            )
        values.update(range(start, stop + 1, step))
    return values


Schedule = Every | Cron


def make_schedule(every: timedelta | float | None, cron: str | None) -> Schedule:
    if (every is None) == (cron is None):
        raise ConfigurationError("give a periodic task either every=... or cron=..., not both")
    if cron is not None:
        return Cron.parse(cron)
    assert every is not None
    return Every(every if isinstance(every, timedelta) else timedelta(seconds=every))
