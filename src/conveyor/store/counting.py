"""Turning the SQL stores' count rows into ``Stats``: the same assembly on both SQL stores."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from conveyor.job import JobState
from conveyor.store.records import LimitStatus, QueueStats, Stats


def assemble_stats(
    counts: Iterable[Sequence[Any]],
    queued: Iterable[Sequence[Any]],
    retrying: dict[str, int],
    paused: set[str],
    age_of: Callable[[Any], float],
    finished_last_minute: int,
    limits: Sequence[LimitStatus],
) -> Stats:
    """``Stats`` from the rows of ``stats_counts`` (queue, state, jobs), ``stats_queued``
    (queue, jobs, oldest ready, due later) and ``stats_retrying`` (queue: jobs).

    ``age_of`` turns a backend's oldest-ready value into its age in seconds.
    """
    per_queue: dict[str, dict[str, int]] = {}
    for queue, state, count in counts:
        per_queue.setdefault(queue, {})[state] = count
    ages: dict[str, float] = {}
    waiting: dict[str, tuple[int, int]] = {}
    for queue, count, oldest_ready, later in queued:
        per_queue.setdefault(queue, {})[JobState.QUEUED.value] = count
        if oldest_ready is not None:
            ages[queue] = max(0.0, age_of(oldest_ready))
        waiting[queue] = (later - retrying.get(queue, 0), retrying.get(queue, 0))
    for queue in paused:
        per_queue.setdefault(queue, {})
    return Stats(
        queues={
            name: QueueStats(
                name=name,
                paused=name in paused,
                counts=dict(sorted(c.items())),
                oldest_ready_age=ages.get(name),
                scheduled=waiting.get(name, (0, 0))[0],
                retrying=waiting.get(name, (0, 0))[1],
            )
            for name, c in sorted(per_queue.items())
        },
        finished_last_minute=finished_last_minute,
        limits={status.queue: status for status in limits},
    )
