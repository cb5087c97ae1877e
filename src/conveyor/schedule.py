"""Schedules of periodic tasks: a fixed interval or a five-field cron string (UTC)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from conveyor.errors import ConfigurationError

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day", 1, 31), ("month", 1, 12), ("weekday", 0, 6))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Days a search may look ahead or back: the gap between two 29ths of February
#: is at most eight years (2096 to 2104), and any expression that matches at
#: all matches within it.
_SEARCH_DAYS = 8 * 366 + 1


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
        cron = cls(
            expression, minutes, hours, days, months, weekdays,
            any_day=parts[2] == "*", any_weekday=parts[4] == "*",
        )  # fmt: skip
        cron.next_tick(_EPOCH)  # refuse now what would never fire (e.g. "0 0 31 2 *")
        return cron

    def matches(self, when: datetime) -> bool:
        if when.minute not in self.minutes or when.hour not in self.hours:
            return False
        return self._day_matches(when)

    def _day_matches(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        day_ok = day.day in self.days
        weekday_ok = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day_ok and weekday_ok
        return day_ok or weekday_ok

    def last_tick(self, now: datetime) -> datetime:
        """The latest matching minute at or before ``now``."""
        end = now.astimezone(UTC).replace(second=0, microsecond=0)
        day = end.replace(hour=0, minute=0)
        latest = (end.hour, end.minute)
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                times = [(h, m) for h in self.hours for m in self.minutes if (h, m) <= latest]
                if times:
                    hour, minute = max(times)
                    return day.replace(hour=hour, minute=minute)
            day -= timedelta(days=1)
            latest = (23, 59)
        raise ConfigurationError(f"cron {self.expression!r} never matches")

    def next_tick(self, now: datetime) -> datetime:
        """The earliest matching minute after ``now``."""
        start = now.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        earliest = (start.hour, start.minute)
        for _ in range(_SEARCH_DAYS):
            if self._day_matches(day):
                times = [(h, m) for h in self.hours for m in self.minutes if (h, m) >= earliest]
                if times:
                    hour, minute = min(times)
                    return day.replace(hour=hour, minute=minute)
            day += timedelta(days=1)
            earliest = (0, 0)
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


@dataclass(frozen=True)
class Periodic:
    """A task the workers enqueue on a schedule."""

    task: str
    schedule: Schedule
