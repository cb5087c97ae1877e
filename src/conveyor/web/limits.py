"""Limits on the dashboard's overview and in /metrics: each limit, how full, what it holds back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from conveyor.limits import fullness_words
from conveyor.store.records import LimitStatus


@dataclass(frozen=True)
class LimitRow:
    """One queue's limits as the overview shows them."""

    queue: str
    limit: str
    per_key: str
    #: How full the queue's own limit is, in words, and as a fraction for a meter (or None).
    full: str
    fraction: float | None
    keys_full: int
    throttled_until: datetime | None
    keys_throttled: int
    held_back: int
    ready: int


def limit_rows(limits: dict[str, LimitStatus]) -> list[LimitRow]:
    rows = []
    for s in limits.values():
        parts = fullness_words(s.limit, s.running, s.started)
        fractions: list[float] = []
        if s.limit is not None and s.limit.concurrency is not None:
            fractions.append(s.running / s.limit.concurrency)
        if s.limit is not None and s.limit.rate is not None:
            fractions.append(s.started / s.limit.rate.count)
        rows.append(
            LimitRow(
                queue=s.queue,
                limit=str(s.limit) if s.limit is not None else "",
                per_key=f"{s.key_limit} each" if s.key_limit is not None else "",
                full=" · ".join(parts),
                fraction=min(1.0, max(fractions)) if fractions else None,
                keys_full=s.keys_full,
                throttled_until=s.throttled_until,
                keys_throttled=s.keys_throttled,
                held_back=s.held_back,
                ready=s.ready,
            )
        )
    return rows


#: Per-queue gauges of a queue with limits: metric, help, LimitStatus field.
LIMIT_GAUGES = (
    ("conveyor_limit_running", "Running jobs of a queue with limits.", "running"),
    (
        "conveyor_limit_started",
        "Jobs a rate-limited queue started in its rate's current window.",
        "started",
    ),
    (
        "conveyor_limit_held_back",
        "Ready jobs that the queue's limits (or throttles) hold back now.",
        "held_back",
    ),
    ("conveyor_limit_keys_full", "Limit keys with ready jobs and no room now.", "keys_full"),
    ("conveyor_limit_keys_throttled", "Limit keys throttled now.", "keys_throttled"),
)


def limit_metrics(out: list[str], limits: dict[str, LimitStatus], now: datetime) -> None:
    """The limit gauges of /metrics (``family`` and ``sample`` lines appended to ``out``)."""
    from conveyor.web.metrics import family, sample  # the writer of the text format

    family(out, "conveyor_limit_rate", "gauge", "Jobs a rate limit lets start per window.")
    for s in limits.values():
        for scope, limit in (("queue", s.limit), ("key", s.key_limit)):
            if limit is not None and limit.rate is not None:
                sample(
                    out, "conveyor_limit_rate", {"queue": s.queue, "scope": scope}, limit.rate.count
                )
    family(out, "conveyor_limit_rate_window_seconds", "gauge", "The window of a rate limit.")
    for s in limits.values():
        for scope, limit in (("queue", s.limit), ("key", s.key_limit)):
            if limit is not None and limit.rate is not None:
                labels = {"queue": s.queue, "scope": scope}
                sample(out, "conveyor_limit_rate_window_seconds", labels, limit.rate.per)
    family(out, "conveyor_limit_concurrency", "gauge", "Jobs a concurrency limit lets run at once.")
    for s in limits.values():
        for scope, limit in (("queue", s.limit), ("key", s.key_limit)):
            if limit is not None and limit.concurrency is not None:
                labels = {"queue": s.queue, "scope": scope}
                sample(out, "conveyor_limit_concurrency", labels, limit.concurrency)
    for name, help_text, field in LIMIT_GAUGES:
        family(out, name, "gauge", help_text)
        for s in limits.values():
            sample(out, name, {"queue": s.queue}, getattr(s, field))
    family(
        out,
        "conveyor_limit_throttled_seconds",
        "gauge",
        "Seconds until the queue's throttle ends (0 when it is not throttled).",
    )
    for s in limits.values():
        left = (s.throttled_until - now).total_seconds() if s.throttled_until else 0.0
        sample(out, "conveyor_limit_throttled_seconds", {"queue": s.queue}, max(0.0, left))
