"""What every store shares about limits that is not SQL: rows to records, how full a limit is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from conveyor.limits import Limit, QueueLimits, Rate
from conveyor.store.records import LimitChange, LimitStatus

#: Seconds a start is kept past its windows: a clock that steps back by less
#: than this cannot make a claim forget a start that still counts. (Claims are
#: judged on one clock that moves forward: SQLite reads it under the write lock,
#: PostgreSQL's claims use the server's and skip a stale snapshot; this is for
#: a clock set back by hand.)
LIMIT_SLACK_SECONDS = 10.0


def limits_of_row(row: Sequence[Any], moment: Callable[[Any], datetime | None]) -> QueueLimits:
    """A ``limits`` row (queue, rate, per, concurrency, key_*, throttled_until) as stored."""
    queue, rate, per, concurrency, key_rate, key_per, key_concurrency, throttled_until = row
    return QueueLimits(
        queue=queue,
        limit=_limit(rate, per, concurrency),
        key_limit=_limit(key_rate, key_per, key_concurrency),
        throttled_until=moment(throttled_until),
    )


def _limit(rate: int | None, per: float | None, concurrency: int | None) -> Limit | None:
    if rate is None and concurrency is None:
        return None
    return Limit(
        rate=Rate(int(rate), float(per)) if rate is not None and per is not None else None,
        concurrency=None if concurrency is None else int(concurrency),
    )


def limit_status(
    limits: QueueLimits,
    now: datetime,
    running: int,
    started: int,
    ready: int,
    keys_full: int,
    key_held: int,
    keys_throttled: int,
) -> LimitStatus:
    """How full a queue's limits are, from the counts the stores' limit_usage reads."""
    throttled = (
        limits.throttled_until if limits.throttled_until and limits.throttled_until > now else None
    )
    room: int | None = None
    if throttled is not None:
        room = 0
    elif limits.limit is not None:
        rooms = []
        if limits.limit.concurrency is not None:
            rooms.append(limits.limit.concurrency - running)
        if limits.limit.rate is not None:
            rooms.append(limits.limit.rate.count - started)
        room = max(0, min(rooms)) if rooms else None
    # Ready jobs beyond their keys' room are held by the key limits; of the
    # others, those beyond the queue's room by the queue's limit.
    passable = max(0, ready - key_held)
    held = key_held + (max(0, passable - room) if room is not None else 0)
    return LimitStatus(
        queue=limits.queue,
        limit=limits.limit,
        key_limit=limits.key_limit,
        throttled_until=throttled,
        running=int(running),
        started=int(started),
        ready=int(ready),
        room=room,
        keys_full=int(keys_full),
        keys_throttled=int(keys_throttled),
        held_back=min(int(ready), int(held)),
    )


def limit_set_params(change: LimitChange, now: object) -> dict[str, Any]:
    """The parameters of both SQL dialects' ``limit_set`` (``now`` as each passes times)."""
    limit = change.limit
    rate = limit.rate if limit is not None else None
    return {
        "queue": change.queue,
        "scope": "key" if change.per_key else "queue",
        "rate": rate.count if rate is not None else None,
        "per": rate.per if rate is not None else None,
        "concurrency": limit.concurrency if limit is not None else None,
        "keep_rate": "rate" in change.keep,
        "keep_concurrency": "concurrency" in change.keep,
        "now": now,
    }
