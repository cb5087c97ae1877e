"""``SqlStore.job_delete_terminal``, the Spark archive's delete, on the SQL stores without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.job import Job, JobState, NewJob
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, Lease
from outcomes import cancelled, retry_one

#: Only SQL stores delete for the archive (Spark refuses Redis).
pytestmark = pytest.mark.sql_only

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def new_job(n: int) -> NewJob:
    return NewJob(queue="default", task="t", args_json=f"[{n}]", kwargs_json="{}", run_at=T0)


def finish(store: Store, jobs: list[Job], now: datetime) -> None:
    claimed = store.job_claim(["default"], len(jobs), "w1", LEASE, now)
    assert {j.id for j in claimed} == {j.id for j in jobs}
    completions = []
    for job in claimed:
        assert job.lease_token is not None
        completions.append(Finish.complete(job.id, job.lease_token, "null"))
    store.job_finish(completions, now)


def test_deletes_only_named_terminal_jobs_finished_before_the_cutoff(store: Store) -> None:
    old = store.job_insert_many([new_job(n) for n in range(3)], T0)
    finish(store, old, T0 + timedelta(seconds=10))
    recent = store.job_insert_many([new_job(9)], T0 + timedelta(seconds=20))
    finish(store, recent, T0 + timedelta(seconds=100))
    live = store.job_insert_many([new_job(10)], T0)
    cutoff = T0 + timedelta(seconds=50)

    # Named but not deletable: finished after the cutoff, or still queued.
    named = [old[0].id, old[1].id, recent[0].id, live[0].id]
    deleted = store.job_delete_terminal(named, cutoff)

    assert sorted(deleted) == [old[0].id, old[1].id]
    assert store.job_get(old[0].id) is None
    assert store.event_list(old[0].id) == []
    # Not named: kept with its history although it could have gone.
    assert store.job_get(old[2].id) is not None
    assert [e.kind for e in store.event_list(old[2].id)] == ["enqueued", "claimed", "succeeded"]
    assert store.job_get(recent[0].id) is not None
    assert store.job_get(live[0].id) is not None
    assert store.job_delete_terminal([], cutoff) == []


def test_a_job_retried_after_it_was_archived_is_kept(store: Store) -> None:
    (job,) = store.job_insert_many([new_job(1)], T0)
    claimed = store.job_claim(["default"], 1, "w1", LEASE, T0)
    store.job_finish(cancelled([Lease(job.id, claimed[0].lease_token or "")]), T0)
    retried = retry_one(store, job.id, T0 + timedelta(seconds=1))
    assert retried is not None

    assert store.job_delete_terminal([job.id], T0 + timedelta(days=1)) == []
    kept = store.job_get(job.id)
    assert kept is not None
    assert kept.state == JobState.QUEUED
