"""``app.batch_status``: a batch's jobs counted by state, on every backend, without Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, InvalidJobError
from conveyor.job import Job, NewJob
from conveyor.store.records import Finish, Lease
from outcomes import Failure, cancelled

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def new_job(batch: str | None, n: int) -> NewJob:
    return NewJob(
        queue="default",
        task="resize",
        args_json=f"[{n}]",
        kwargs_json="{}",
        run_at=T0,
        batch=batch,
    )


def lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def test_batch_status_counts_each_state(app: App) -> None:
    store = app.store
    jobs = store.job_insert_many([new_job("b1", n) for n in range(7)], T0)
    store.job_insert_many([new_job("b2", 0), new_job(None, 0)], T0)
    claimed = store.job_claim(["default"], 6, "w1", LEASE, T0 + timedelta(seconds=1))
    # Oldest first: the claim took the first six jobs of b1, in order.
    assert [j.id for j in claimed] == [j.id for j in jobs[:6]]
    later = T0 + timedelta(seconds=2)
    store.job_finish([Finish.complete(j.id, lease(j).token, "1") for j in claimed[:2]], later)
    store.job_finish([Failure(claimed[2].id, lease(claimed[2]).token, "boom", later, False)], later)
    # A retryable failure with attempts left is queued again: still outstanding.
    store.job_finish([Failure(claimed[3].id, lease(claimed[3]).token, "flaky", later)], later)
    store.job_finish(cancelled([lease(claimed[5])]), later)

    status = app.batch_status("b1")

    assert status.batch == "b1"
    assert status.counts == {
        "cancelled": 1,
        "failed": 1,
        "queued": 2,
        "running": 1,
        "succeeded": 2,
    }
    assert (status.done, status.failed, status.cancelled) == (2, 1, 1)
    assert (status.queued, status.running, status.outstanding, status.total) == (2, 1, 3, 7)
    assert not status.finished
    assert app.batch_status("b2").total == 1


def test_batch_status_is_finished_once_nothing_is_outstanding(app: App) -> None:
    store = app.store
    store.job_insert_many([new_job("b1", n) for n in range(3)], T0)
    claimed = store.job_claim(["default"], 3, "w1", LEASE, T0)
    store.job_finish([Finish.complete(claimed[0].id, lease(claimed[0]).token, "1")], T0)
    assert not app.batch_status("b1").finished

    store.job_finish([Finish.complete(j.id, lease(j).token, "2") for j in claimed[1:]], T0)

    status = app.batch_status("b1")
    assert status.finished
    assert (status.done, status.outstanding, status.total) == (3, 0, 3)


def test_unknown_batch_has_no_jobs_and_is_not_finished(app: App) -> None:
    status = app.batch_status("never-enqueued")

    assert status.counts == {}
    assert status.total == 0
    assert not status.finished


def test_batch_name_is_validated(app: App) -> None:
    with pytest.raises(InvalidJobError, match="batch must not be empty"):
        app.batch_status("  ")
