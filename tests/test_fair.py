"""Fair turns (app.fair): claims of a fair queue take ready jobs from its keys in turn,
weighted, on every store; counted, never timed."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from conveyor import App
from conveyor.job import NewJob, utcnow

LEASE = timedelta(minutes=5)


def _jobs(queue: str, key: str | None, count: int, priority: int = 0) -> list[NewJob]:
    now = utcnow()
    return [
        NewJob(task="t", queue=queue, limit_key=key, priority=priority, args_json="[]",
               kwargs_json="{}", run_at=now)
        for _ in range(count)
    ]  # fmt: skip


def _claim(app: App, queue: str, jobs: int, per_claim: int = 10) -> Counter[str | None]:
    """Keys of ``jobs`` jobs claimed ``per_claim`` at a time."""
    started: Counter[str | None] = Counter()
    while sum(started.values()) < jobs:
        got = app.store.job_claim([queue], per_claim, "w", LEASE)
        assert got, "the queue ran dry"
        started.update(j.limit_key for j in got)
    return started


def test_latecomers_get_turns_before_a_backlog(app: App) -> None:
    app.fair("q")
    app.enqueue_many(_jobs("q", "A", 2000))
    first = _claim(app, "q", 50)
    assert first == {"A": 50}
    app.enqueue_many(_jobs("q", "B", 100) + _jobs("q", "C", 100))
    started: Counter[str | None] = Counter()
    while started["B"] + started["C"] < 200:
        got = app.store.job_claim(["q"], 10, "w", LEASE)
        started.update(j.limit_key for j in got)
    # Equal weights: A had about a third of the starts meanwhile.
    assert started["A"] <= 110, started


def test_weights_split_starts(app: App) -> None:
    app.fair("q", weights={"gold": 3})
    app.enqueue_many(_jobs("q", "gold", 1000) + _jobs("q", "A", 1000))
    started = _claim(app, "q", 800)
    assert abs(started["gold"] / started["A"] - 3) < 0.15, started
