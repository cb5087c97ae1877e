"""Expiry: a job not started by its deadline (``expires=``) never starts.

On every store: the claim passes a job past its deadline by, the sweep
(``job_expire``, run by maintenance) ends it cancelled with the expiry's error
and an event, a retry keeps the deadline, a running job is never touched, a job
waiting for an expired one is resolved, and the sweep is bounded per round.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, InvalidJobError
from conveyor.errors import ConfigurationError
from conveyor.expiry import EXPIRED_ERROR, resolve_expires
from conveyor.job import JobState, NewJob
from conveyor.store.expiring import ExpiringStore
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from conveyor.testing import drain
from conveyor.worker.maintenance import Maintenance
from outcomes import Failure

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def new(expires_in: float | None, *, key: str | None = None, group: str | None = None) -> NewJob:
    expires_at = None if expires_in is None else NOW + timedelta(seconds=expires_in)
    return NewJob("q", "t", "[]", "{}", run_at=NOW, key=key, group=group, expires_at=expires_at)


def expiring(store: Store) -> ExpiringStore:
    assert isinstance(store, ExpiringStore)
    return store


def test_a_job_past_its_deadline_is_passed_by_then_ended_with_its_event(store: Store) -> None:
    late, on_time, plain = store.job_insert_many([new(5), new(60), new(None)], NOW)
    assert expiring(store).job_expires_at([late.id, on_time.id, plain.id]) == {
        late.id: NOW + timedelta(seconds=5),
        on_time.id: NOW + timedelta(seconds=60),
    }
    later = NOW + timedelta(seconds=10)
    claimed = store.job_claim(["q"], 10, "w", LEASE, later)
    assert sorted(j.id for j in claimed) == [on_time.id, plain.id]
    assert expiring(store).job_expire(later) == [late.id]
    ended = store.job_get(late.id)
    assert ended is not None and ended.state is JobState.CANCELLED
    assert ended.error == EXPIRED_ERROR and ended.finished_at == later
    last = store.event_list(late.id)[-1]
    assert (last.kind, last.error) == ("cancelled", EXPIRED_ERROR)
    assert expiring(store).job_expire(later) == []  # once


def test_the_sweep_leaves_running_jobs_and_jobs_before_their_deadline(store: Store) -> None:
    running, waiting = store.job_insert_many([new(5), new(60)], NOW)
    (lease,) = store.job_claim(["q"], 1, "w", LEASE, NOW)
    assert lease.id == running.id
    later = NOW + timedelta(seconds=10)
    assert expiring(store).job_expire(later) == []
    assert store.job_finish([Finish(lease.id, lease.lease_token or "", "complete", "1")], later)
    assert store.job_get(running.id).state is JobState.SUCCEEDED  # type: ignore[union-attr]
    assert store.job_get(waiting.id).state is JobState.QUEUED  # type: ignore[union-attr]


def test_a_retry_keeps_the_deadline(store: Store) -> None:
    (job,) = store.job_insert_many([new(30)], NOW)
    (lease,) = store.job_claim(["q"], 1, "w", LEASE, NOW)
    store.job_finish(
        [Failure(job.id, lease.lease_token or "", "boom", NOW + timedelta(seconds=60))]
    )
    again = store.job_get(job.id)
    assert again is not None and again.state is JobState.QUEUED
    after = NOW + timedelta(seconds=61)
    assert store.job_claim(["q"], 1, "w", LEASE, after) == []
    assert expiring(store).job_expire(after) == [job.id]
    assert store.job_get(job.id).error == EXPIRED_ERROR  # type: ignore[union-attr]


def test_the_sweep_is_bounded_and_goes_on_next_round(store: Store) -> None:
    jobs = store.job_insert_many([new(i + 1) for i in range(5)], NOW)
    later = NOW + timedelta(minutes=1)
    first = expiring(store).job_expire(later, limit=3)
    assert first == [j.id for j in jobs[:3]]  # oldest deadline first
    assert expiring(store).job_expire(later, limit=3) == [j.id for j in jobs[3:]]


def test_an_expired_head_frees_its_group(store: Store) -> None:
    head, second = store.job_insert_many([new(5, group="g"), new(None, group="g")], NOW)
    later = NOW + timedelta(seconds=10)
    assert store.job_claim(["q"], 1, "w", LEASE, later) == []  # the head holds its group
    assert expiring(store).job_expire(later) == [head.id]
    assert [j.id for j in store.job_claim(["q"], 1, "w", LEASE, later)] == [second.id]


def test_a_key_is_free_again_once_its_job_expired(store: Store) -> None:
    (first,) = store.job_insert_many([new(5, key="k")], NOW)
    later = NOW + timedelta(seconds=10)
    expiring(store).job_expire(later)
    (second,) = store.job_insert_many([new(None, key="k")], later)
    assert second.id != first.id


def test_jobs_waiting_for_an_expired_job_are_cancelled(app: App) -> None:
    @app.task(queue="q")
    def step() -> None: ...

    parent = step.options(expires=0.2).enqueue()
    child = step.options(after=[parent]).enqueue()
    assert child.state is JobState.WAITING
    later = datetime.now(UTC) + timedelta(seconds=1)
    assert expiring(app.store).job_expire(later) == [parent.id]
    assert app.get(child.id).state is JobState.CANCELLED


def test_enqueue_options_and_task_defaults(app: App) -> None:
    @app.task(queue="q", expires=timedelta(minutes=5))
    def tidy() -> None: ...

    default = tidy.enqueue()
    mine = tidy.options(expires=30).enqueue()
    deadline = datetime(2100, 1, 1, tzinfo=UTC)
    fixed = app.enqueue("tidy", expires=deadline)
    got = expiring(app.store).job_expires_at([default.id, mine.id, fixed.id])
    assert got[fixed.id] == deadline
    assert timedelta(minutes=4) < got[default.id] - default.created_at <= timedelta(minutes=5)
    assert got[mine.id] - mine.created_at == timedelta(seconds=30)


@pytest.mark.parametrize(
    ("expires", "words"),
    [
        (0, "positive"),
        (-1, "positive"),
        (float("nan"), "positive"),
        ("soon", "seconds, a timedelta or an aware datetime"),
        (True, "seconds, a timedelta or an aware datetime"),
        (datetime(2100, 1, 1), "timezone-aware"),
        (datetime(2000, 1, 1, tzinfo=UTC), "could never start"),
    ],
)
def test_bad_expires_is_refused_with_nothing_written(app: App, expires: object, words: str) -> None:
    @app.task(queue="q")
    def job() -> None: ...

    with pytest.raises(InvalidJobError, match=words):
        job.options(expires=expires).enqueue()
    assert app.store.job_get(1) is None


def test_a_deadline_before_the_job_is_due_is_refused() -> None:
    with pytest.raises(InvalidJobError, match="could never start"):
        resolve_expires(NOW, NOW + timedelta(minutes=5), 60)


def test_a_task_default_is_checked_when_registered(app: App) -> None:
    with pytest.raises(ConfigurationError, match=r"task 'bad'.*positive"):

        @app.task(name="bad", expires=-5)
        def bad() -> None: ...


def test_a_worker_never_runs_an_expired_job_and_maintenance_ends_it(app: App) -> None:
    ran: list[int] = []

    @app.task(queue="q")
    def work(n: int) -> None:
        ran.append(n)

    expired = work.options(expires=0.05).enqueue(1)
    fresh = work.enqueue(2)
    time.sleep(0.1)
    drain(app, queues=["q"])
    assert ran == [2]
    assert app.get(fresh.id).state is JobState.SUCCEEDED
    assert app.get(expired.id).state is JobState.QUEUED  # passed by, not yet ended
    Maintenance(app.runtime, "leader", lease=5).run_once()
    ended = app.get(expired.id)
    assert ended.state is JobState.CANCELLED and ended.error == EXPIRED_ERROR


def test_the_async_twin_takes_expires(app: App) -> None:
    @app.task(queue="q")
    def later() -> None: ...

    job = asyncio.run(later.options(expires=timedelta(minutes=1)).aenqueue())
    got = expiring(app.store).job_expires_at([job.id])
    assert got == {job.id: job.created_at + timedelta(minutes=1)}


def test_a_manual_retry_of_an_expired_job_runs_it_without_its_deadline(app: App) -> None:
    ran: list[int] = []

    @app.task(queue="q")
    def work(n: int) -> None:
        ran.append(n)

    job = work.options(expires=0.05).enqueue(1)
    time.sleep(0.1)
    expiring(app.store).job_expire()
    assert app.get(job.id).error == EXPIRED_ERROR
    app.retry(job.id)
    assert expiring(app.store).job_expires_at([job.id]) == {}
    drain(app, queues=["q"])
    assert ran == [1] and app.get(job.id).state is JobState.SUCCEEDED
