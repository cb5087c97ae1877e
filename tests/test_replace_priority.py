"""A queued job replaced with another priority is claimed by its new priority, on
every store (Redis's ready index names a job by its priority: it is made anew)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from conveyor.job import NewJob
from conveyor.store.protocols import Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(priority: int, key: str | None = None, on_conflict: str = "answer") -> NewJob:
    return NewJob(
        "q", "t", "[]", "{}", run_at=NOW, priority=priority, key=key, on_conflict=on_conflict
    )


def test_a_replaced_priority_orders_the_claim(store: Store) -> None:
    plain, keyed = store.job_insert_many([job(1), job(5, key="k")], NOW)
    (replaced,) = store.job_insert_many([job(0, key="k", on_conflict="replace")], NOW)
    assert replaced.id == keyed.id and replaced.priority == 0
    claimed = store.job_claim(["q"], 1, "w", timedelta(seconds=30), NOW)
    assert [j.id for j in claimed] == [plain.id]
    raised = store.job_insert_many([job(9, key="k", on_conflict="replace")], NOW)
    assert [j.id for j in raised] == [keyed.id]
    (second,) = store.job_claim(["q"], 1, "w", timedelta(seconds=30), NOW)
    assert second.id == keyed.id and second.priority == 9
