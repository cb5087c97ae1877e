"""The store contract: the state machine of docs/architecture.md, checked on every backend.

Each test runs once per backend through the ``store`` fixture. The clock is
fixed: every call takes ``now`` as T0 plus an offset, never the wall clock.
Tests are grouped by the row of the state machine they check, then by the
store's reading, operating and lifecycle methods.

Payloads are compared as parsed JSON, not as text: a backend may store JSON in
a normalised form (whitespace, key order), and the contract is that the values
a handler reads back are the values that were enqueued.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest

from conveyor.errors import JobStateError
from conveyor.job import Job, JobState, NewJob, Unique, encode_json, encode_payload
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, Lease, LeaseStatus
from outcomes import Failure, cancel_one, cancelled, listed, purge, released, retry_one

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
LEASE_LOST = "worker lost: lease expired"

QUEUED, RUNNING = JobState.QUEUED, JobState.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED


# --- helpers ----------------------------------------------------------------


def at(seconds: float) -> datetime:
    """T0 plus a number of seconds: the only clock these tests use."""
    return T0 + timedelta(seconds=seconds)


def new_job(
    task: str = "send",
    *,
    queue: str = "default",
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    run_at: datetime = T0,
    priority: int = 0,
    max_attempts: int = 3,
    key: str | None = None,
    unique: Unique = "live",
    group: str | None = None,
    batch: str | None = None,
) -> NewJob:
    args_json, kwargs_json = encode_payload(args or [], kwargs or {})
    return NewJob(
        queue=queue,
        task=task,
        args_json=args_json,
        kwargs_json=kwargs_json,
        run_at=run_at,
        priority=priority,
        max_attempts=max_attempts,
        key=key,
        unique=unique,
        group=group,
        batch=batch,
    )


def enqueue(store: Store, *jobs: NewJob, now: datetime = T0) -> list[Job]:
    return store.job_insert_many(list(jobs), now)


def enqueue_one(store: Store, *, now: datetime = T0, **fields: Any) -> Job:
    (job,) = store.job_insert_many([new_job(**fields)], now)
    return job


def claim(
    store: Store,
    queues: tuple[str, ...] = ("default",),
    *,
    limit: int = 10,
    now: datetime = T0,
    worker: str = "w1",
    lease: timedelta = LEASE,
    group: str | None = None,
) -> list[Job]:
    return store.job_claim(list(queues), limit, worker, lease, now, group=group)


def claim_one(
    store: Store,
    queues: tuple[str, ...] = ("default",),
    *,
    now: datetime = T0,
    worker: str = "w1",
    lease: timedelta = LEASE,
) -> Job:
    jobs = claim(store, queues, limit=1, now=now, worker=worker, lease=lease)
    assert len(jobs) == 1, f"expected one job claimed, got {jobs}"
    return jobs[0]


def running(store: Store, *, now: datetime = T0, **fields: Any) -> Job:
    """Enqueue one job and claim it (in a store with no other ready job in its queue)."""
    job = enqueue_one(store, now=now, **fields)
    claimed = claim_one(store, (job.queue,), now=now)
    assert claimed.id == job.id
    return claimed


def lease_of(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def stale(job: Job) -> Lease:
    return Lease(job.id, "a-token-no-claim-ever-gave")


def get(store: Store, job_id: int) -> Job:
    job = store.job_get(job_id)
    assert job is not None, f"job {job_id} is gone"
    return job


def kinds(store: Store, job_id: int) -> list[str]:
    return [event.kind for event in store.event_list(job_id)]


def fail(
    store: Store,
    job: Job,
    *,
    now: datetime = T0,
    retry_at: datetime | None = None,
    retryable: bool = True,
    error: str = "boom",
) -> list[int]:
    failure = Failure(job.id, lease_of(job).token, error, retry_at or now, retryable)
    return store.job_finish([failure], now)


def complete(
    store: Store, job: Job, result: Any = None, *, now: datetime = T0, token: str | None = None
) -> list[int]:
    result_json = None if result is None else encode_json("result", result)
    return store.job_finish(
        [Finish.complete(job.id, token or lease_of(job).token, result_json)], now
    )


# --- enqueue: -> queued -------------------------------------------------------


def test_insert_one_job_is_queued_with_no_attempts(store: Store) -> None:
    given = new_job(
        "mail",
        queue="emails",
        args=[1, "a"],
        kwargs={"to": "x"},
        run_at=at(5),
        priority=7,
        max_attempts=4,
        group="g",
        batch="b",
    )
    (job,) = enqueue(store, given, now=at(1))
    for read in (job, get(store, job.id)):
        assert read.state == QUEUED
        assert read.attempts == 0
        assert (read.queue, read.task, read.priority, read.max_attempts) == ("emails", "mail", 7, 4)
        assert (read.group, read.batch, read.key) == ("g", "b", None)
        assert read.args == [1, "a"]
        assert read.kwargs == {"to": "x"}
        assert read.run_at == at(5)
        assert read.created_at == at(1)
        assert read.lease_token is None and read.worker is None
        assert read.started_at is None and read.finished_at is None
        assert read.cancel_requested is False


def test_insert_many_returns_jobs_in_input_order_with_increasing_ids(store: Store) -> None:
    jobs = enqueue(store, new_job("a"), new_job("b"), new_job("c", queue="other"))
    assert [j.task for j in jobs] == ["a", "b", "c"]
    assert jobs[0].id < jobs[1].id < jobs[2].id
    assert [get(store, j.id).task for j in jobs] == ["a", "b", "c"]
    assert all(get(store, j.id).state == QUEUED for j in jobs)
    assert all(get(store, j.id).attempts == 0 for j in jobs)


def test_ids_keep_increasing_across_inserts(store: Store) -> None:
    first = enqueue(store, new_job(), new_job())
    second = enqueue(store, new_job())
    assert second[0].id > max(j.id for j in first)


def test_insert_records_enqueued_event_with_attempt_zero(store: Store) -> None:
    jobs = enqueue(store, new_job("a"), new_job("b", queue="other"), now=at(3))
    for job in jobs:
        (event,) = store.event_list(job.id)
        assert event.kind == "enqueued"
        assert event.attempt == 0
        assert (event.job_id, event.queue, event.task) == (job.id, job.queue, job.task)
        assert event.at == at(3)


def test_insert_of_nothing_returns_nothing(store: Store) -> None:
    assert store.job_insert_many([], T0) == []
    assert listed(store) == []


def test_insert_with_key_of_queued_job_returns_it(store: Store) -> None:
    first = enqueue_one(store, key="k", args=[1])
    again = enqueue_one(store, now=at(1), key="k", args=[2])
    assert again.id == first.id
    assert again.state == QUEUED
    assert again.args == [1]
    assert [j.id for j in listed(store)] == [first.id]
    assert kinds(store, first.id) == ["enqueued"]


def test_insert_with_key_of_running_job_returns_it(store: Store) -> None:
    first = running(store, key="k")
    again = enqueue_one(store, now=at(1), key="k")
    assert again.id == first.id
    assert again.state == RUNNING
    assert len(listed(store)) == 1


@pytest.mark.parametrize("ending", ["succeeded", "failed", "cancelled"])
def test_insert_with_key_of_finished_job_inserts_a_new_one(store: Store, ending: str) -> None:
    first = running(store, key="k", max_attempts=1)
    if ending == "succeeded":
        assert complete(store, first) == [first.id]
    elif ending == "failed":
        assert fail(store, first) == [first.id]
    else:
        assert store.job_finish(cancelled([lease_of(first)]), T0) == [first.id]
    again = enqueue_one(store, now=at(1), key="k")
    assert again.id > first.id
    assert again.state == QUEUED
    assert get(store, first.id).state == ending


def test_insert_forever_key_returns_the_finished_job(store: Store) -> None:
    first = running(store, key="k")
    complete(store, first, {"done": True})
    again = enqueue_one(store, now=at(1), key="k", unique="forever")
    assert again.id == first.id
    assert again.state == SUCCEEDED
    assert again.result == {"done": True}
    assert len(listed(store)) == 1


def test_insert_forever_key_returns_the_live_job(store: Store) -> None:
    first = enqueue_one(store, key="k")
    again = enqueue_one(store, key="k", unique="forever")
    assert again.id == first.id


def test_insert_forever_key_without_previous_job_inserts(store: Store) -> None:
    job = enqueue_one(store, key="k", unique="forever")
    assert get(store, job.id).key == "k"
    assert get(store, job.id).state == QUEUED


def test_insert_forever_key_after_purge_inserts_a_new_job(store: Store) -> None:
    first = running(store, key="k")
    complete(store, first, now=at(1))
    assert purge(store, at(2)) == 1
    again = enqueue_one(store, now=at(3), key="k", unique="forever")
    assert again.id > first.id
    assert again.state == QUEUED


def test_keys_are_per_queue(store: Store) -> None:
    a, b = enqueue(store, new_job(queue="a", key="k"), new_job(queue="b", key="k"))
    assert a.id != b.id
    (c,) = enqueue(store, new_job(queue="b", key="k"))
    assert c.id == b.id
    assert {j.queue for j in listed(store)} == {"a", "b"}


def test_same_key_twice_in_one_batch_gives_one_job(store: Store) -> None:
    jobs = enqueue(store, new_job("x", key="k"), new_job("y", key="k"))
    assert jobs[0].id == jobs[1].id
    assert jobs[1].task == "x"
    assert [j.id for j in listed(store)] == [jobs[0].id]
    assert kinds(store, jobs[0].id) == ["enqueued"]


def test_batch_mixing_existing_and_new_keys_keeps_input_order(store: Store) -> None:
    old = enqueue_one(store, key="k1")
    jobs = enqueue(store, new_job("a"), new_job("b", key="k1"), new_job("c", key="k2"))
    assert jobs[1].id == old.id
    assert old.id < jobs[0].id < jobs[2].id
    assert [jobs[0].task, jobs[2].task] == ["a", "c"]
    assert len(listed(store)) == 3


# --- reading jobs -------------------------------------------------------------


def test_job_get_of_missing_id_returns_none(store: Store) -> None:
    enqueue_one(store)
    assert store.job_get(987_654) is None


def test_job_get_many_keeps_the_order_of_ids(store: Store) -> None:
    a, b, c = enqueue(store, new_job("a"), new_job("b"), new_job("c"))
    found = store.job_get_many([c.id, 987_654, a.id, b.id])
    assert [j.id for j in found] == [c.id, a.id, b.id]
    assert [j.task for j in found] == ["c", "a", "b"]


# --- queued -> claim -> running -----------------------------------------------


def test_claim_takes_up_to_limit_jobs_in_one_call(store: Store) -> None:
    jobs = enqueue(store, *(new_job() for _ in range(5)))
    claimed = claim(store, limit=3)
    assert [j.id for j in claimed] == [j.id for j in jobs[:3]]
    assert all(get(store, j.id).state == RUNNING for j in jobs[:3])
    assert all(get(store, j.id).state == QUEUED for j in jobs[3:])


def test_claim_with_no_ready_job_returns_nothing(store: Store) -> None:
    assert claim(store) == []


def test_claim_does_not_hand_out_a_running_job_again(store: Store) -> None:
    job = running(store)
    assert claim(store, now=at(1)) == []
    assert get(store, job.id).attempts == 1


def test_claim_takes_higher_priority_first_then_oldest(store: Store) -> None:
    low1, high1, low2, high2 = enqueue(
        store,
        new_job(priority=0),
        new_job(priority=5),
        new_job(priority=0),
        new_job(priority=5),
    )
    assert [j.id for j in claim(store, limit=2)] == [high1.id, high2.id]
    assert [j.id for j in claim(store, limit=2)] == [low1.id, low2.id]


def test_claim_orders_across_queues_by_priority(store: Store) -> None:
    a, b = enqueue(store, new_job(queue="a", priority=1), new_job(queue="b", priority=9))
    assert [j.id for j in claim(store, ("a", "b"), limit=1)] == [b.id]
    assert [j.id for j in claim(store, ("a", "b"), limit=1)] == [a.id]


def test_claim_skips_jobs_scheduled_in_the_future(store: Store) -> None:
    job = enqueue_one(store, run_at=at(60))
    assert claim(store, now=T0) == []
    assert claim(store, now=at(59.999999)) == []
    assert [j.id for j in claim(store, now=at(60))] == [job.id]


def test_claim_skips_paused_queue(store: Store) -> None:
    paused, other = enqueue(store, new_job(queue="p"), new_job(queue="o"))
    store.queue_pause("p", T0)
    assert store.queue_paused() == {"p"}
    assert [j.id for j in claim(store, ("p", "o"))] == [other.id]
    assert claim(store, ("p",), now=at(1)) == []
    store.queue_resume("p", at(2))
    assert store.queue_paused() == set()
    assert [j.id for j in claim(store, ("p",), now=at(2))] == [paused.id]


def test_claim_only_takes_from_the_given_queues(store: Store) -> None:
    a, b = enqueue(store, new_job(queue="a"), new_job(queue="b"))
    assert [j.id for j in claim(store, ("a",))] == [a.id]
    assert get(store, b.id).state == QUEUED
    assert claim(store, ("c",)) == []


def test_claim_sets_attempt_worker_and_lease(store: Store) -> None:
    enqueue_one(store)
    (job,) = claim(store, now=at(2), worker="worker-7", lease=timedelta(seconds=45))
    for read in (job, get(store, job.id)):
        assert read.state == RUNNING
        assert read.attempts == 1
        assert read.worker == "worker-7"
        assert read.lease_token
        assert read.lease_expires_at == at(47)
        assert read.started_at == at(2)
    assert get(store, job.id).lease_token == job.lease_token


def test_claim_gives_a_fresh_lease_token_per_call(store: Store) -> None:
    enqueue(store, new_job(), new_job())
    first = claim_one(store)
    second = claim_one(store)
    assert first.lease_token != second.lease_token
    assert store.job_finish(released([lease_of(first)]), at(1)) == [first.id]
    again = claim_one(store, now=at(1))
    assert again.id == first.id
    assert again.lease_token not in (first.lease_token, second.lease_token)


def test_claim_records_claimed_event(store: Store) -> None:
    job = enqueue_one(store)
    claim(store, now=at(4), worker="w9")
    assert kinds(store, job.id) == ["enqueued", "claimed"]
    event = store.event_list(job.id)[-1]
    assert (event.attempt, event.worker, event.at) == (1, "w9", at(4))


def test_claim_runs_one_job_per_group_at_a_time(store: Store) -> None:
    first, second = enqueue(store, new_job(group="g"), new_job(group="g"))
    assert [j.id for j in claim(store)] == [first.id]
    assert claim(store, now=at(1)) == []
    assert get(store, second.id).state == QUEUED


def test_claim_takes_the_oldest_job_of_a_group_first(store: Store) -> None:
    older, younger = enqueue(store, new_job(group="g"), new_job(group="g", priority=10))
    assert [j.id for j in claim(store)] == [older.id]
    assert get(store, younger.id).state == QUEUED


def test_claim_takes_different_groups_together(store: Store) -> None:
    g1a, g1b, g2a, plain = enqueue(
        store, new_job(group="g1"), new_job(group="g1"), new_job(group="g2"), new_job()
    )
    assert {j.id for j in claim(store)} == {g1a.id, g2a.id, plain.id}
    assert get(store, g1b.id).state == QUEUED


def test_next_group_job_is_claimable_after_the_running_one_finishes(store: Store) -> None:
    first, second = enqueue(store, new_job(group="g"), new_job(group="g"))
    (job,) = claim(store)
    assert complete(store, job, now=at(1)) == [first.id]
    assert [j.id for j in claim(store, now=at(1))] == [second.id]


def test_group_waits_for_its_head_while_it_waits_for_a_retry(store: Store) -> None:
    first, second = enqueue(store, new_job(group="g"), new_job(group="g"))
    (job,) = claim(store)
    assert fail(store, job, now=at(1), retry_at=at(60)) == [first.id]
    assert claim(store, now=at(1)) == []
    assert claim(store, now=at(59)) == []
    assert [j.id for j in claim(store, now=at(60))] == [first.id]
    assert get(store, second.id).state == QUEUED


def test_group_waits_for_a_head_scheduled_later(store: Store) -> None:
    head, _ = enqueue(store, new_job(group="g", run_at=at(60)), new_job(group="g"))
    assert claim(store) == []
    assert [j.id for j in claim(store, now=at(60))] == [head.id]


def test_cancelled_group_head_lets_the_next_job_run(store: Store) -> None:
    head, second = enqueue(store, new_job(group="g", run_at=at(60)), new_job(group="g"))
    assert claim(store) == []
    cancel_one(store, head.id, at(1))
    assert [j.id for j in claim(store, now=at(1))] == [second.id]


def test_claim_with_group_takes_only_that_group(store: Store) -> None:
    _, g2, _ = enqueue(store, new_job(group="g1"), new_job(group="g2"), new_job())
    assert [j.id for j in claim(store, group="g2")] == [g2.id]
    assert claim(store, group="g2", now=at(1)) == []
    assert len(claim(store, now=at(1))) == 2


# --- running -> heartbeat -> running -------------------------------------------


def test_heartbeat_extends_the_lease(store: Store) -> None:
    job = running(store)
    answer = store.job_heartbeat([lease_of(job)], timedelta(seconds=40), at(20))
    assert answer == [LeaseStatus(id=job.id, cancel_requested=False)]
    assert get(store, job.id).lease_expires_at == at(60)
    assert get(store, job.id).state == RUNNING


def test_heartbeat_ignores_stale_tokens(store: Store) -> None:
    enqueue(store, new_job(), new_job())
    held, other = claim(store)
    answer = store.job_heartbeat([lease_of(held), stale(other)], LEASE, at(20))
    assert [status.id for status in answer] == [held.id]
    assert get(store, held.id).lease_expires_at == at(50)
    assert get(store, other.id).lease_expires_at == at(30)


def test_heartbeat_of_a_finished_job_answers_nothing(store: Store) -> None:
    job = running(store)
    complete(store, job)
    assert store.job_heartbeat([lease_of(job)], LEASE, at(1)) == []
    assert get(store, job.id).lease_expires_at is None


def test_heartbeat_reports_cancel_requested(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(1))
    answer = store.job_heartbeat([lease_of(job)], LEASE, at(2))
    assert answer == [LeaseStatus(id=job.id, cancel_requested=True)]


# --- running -> succeed -> succeeded --------------------------------------------


def test_complete_stores_the_result_and_finishes(store: Store) -> None:
    job = running(store)
    result = {"b": [1, 2.5, None], "a": "é", "n": 2**64}
    assert complete(store, job, result, now=at(3)) == [job.id]
    done = get(store, job.id)
    assert done.state == SUCCEEDED
    assert done.result == result
    assert done.finished_at == at(3)
    assert done.lease_token is None
    assert done.error is None


def test_complete_records_succeeded_event(store: Store) -> None:
    job = running(store, now=at(1))
    complete(store, job, 1, now=at(3))
    assert kinds(store, job.id) == ["enqueued", "claimed", "succeeded"]
    event = store.event_list(job.id)[-1]
    assert (event.attempt, event.worker, event.at) == (1, "w1", at(3))


def test_complete_with_none_result(store: Store) -> None:
    job = running(store)
    assert store.job_finish([Finish.complete(job.id, lease_of(job).token, None)], T0) == [job.id]
    done = get(store, job.id)
    assert done.state == SUCCEEDED
    assert done.result_json is None


def test_complete_with_json_null_result(store: Store) -> None:
    job = running(store)
    assert store.job_finish([Finish.complete(job.id, lease_of(job).token, "null")], T0) == [job.id]
    assert get(store, job.id).result is None
    assert get(store, job.id).state == SUCCEEDED


def test_complete_many_in_one_call(store: Store) -> None:
    enqueue(store, new_job(), new_job())
    a, b = claim(store)
    ids = store.job_finish(
        [
            Finish.complete(a.id, lease_of(a).token, "1"),
            Finish.complete(b.id, lease_of(b).token, "2"),
        ],
        T0,
    )
    assert sorted(ids) == [a.id, b.id]
    assert [get(store, a.id).result, get(store, b.id).result] == [1, 2]


def test_complete_with_stale_token_changes_nothing(store: Store) -> None:
    job = running(store)
    assert complete(store, job, "late", token=stale(job).token) == []
    after = get(store, job.id)
    assert after.state == RUNNING
    assert after.result_json is None
    assert after.lease_token == job.lease_token
    assert kinds(store, job.id) == ["enqueued", "claimed"]


def test_complete_twice_records_the_first_outcome_only(store: Store) -> None:
    job = running(store)
    assert complete(store, job, "first", now=at(1)) == [job.id]
    assert complete(store, job, "second", now=at(2)) == []
    done = get(store, job.id)
    assert done.result == "first"
    assert done.finished_at == at(1)
    assert kinds(store, job.id).count("succeeded") == 1


# --- running -> fail -> queued / failed ----------------------------------------


def test_fail_with_attempts_left_queues_at_retry_at(store: Store) -> None:
    job = running(store, max_attempts=3)
    assert fail(store, job, now=at(1), retry_at=at(30), error="boom\nTraceback") == [job.id]
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.run_at == at(30)
    assert after.error == "boom\nTraceback"
    assert after.attempts == 1
    assert after.finished_at is None
    assert after.lease_token is None and after.lease_expires_at is None


def test_fail_with_attempts_left_records_retried_event(store: Store) -> None:
    job = running(store)
    fail(store, job, now=at(1), retry_at=at(30), error="boom")
    assert kinds(store, job.id) == ["enqueued", "claimed", "retried"]
    event = store.event_list(job.id)[-1]
    assert (event.attempt, event.error, event.at) == (1, "boom", at(1))


def test_failed_attempt_is_claimable_again_at_retry_at(store: Store) -> None:
    job = running(store)
    fail(store, job, now=at(1), retry_at=at(30))
    assert claim(store, now=at(29)) == []
    again = claim_one(store, now=at(30))
    assert again.id == job.id
    assert again.attempts == 2


def test_fail_on_the_last_attempt_fails_for_good(store: Store) -> None:
    job = running(store, max_attempts=1)
    assert fail(store, job, now=at(2), retry_at=at(30), error="bad") == [job.id]
    after = get(store, job.id)
    assert after.state == FAILED
    assert after.finished_at == at(2)
    assert after.error == "bad"
    assert after.lease_token is None
    assert kinds(store, job.id) == ["enqueued", "claimed", "failed"]
    assert store.event_list(job.id)[-1].error == "bad"


def test_fail_uses_up_attempts_until_max_attempts(store: Store) -> None:
    job = enqueue_one(store, max_attempts=3)
    for attempt in range(1, 4):
        claimed = claim_one(store, now=at(attempt))
        assert claimed.attempts == attempt
        fail(store, claimed, now=at(attempt), retry_at=at(attempt))
    assert get(store, job.id).state == FAILED
    assert get(store, job.id).attempts == 3
    assert kinds(store, job.id) == ["enqueued"] + ["claimed", "retried"] * 2 + ["claimed", "failed"]


def test_fail_not_retryable_fails_at_once(store: Store) -> None:
    job = running(store, max_attempts=5)
    assert fail(store, job, now=at(1), retry_at=at(30), retryable=False) == [job.id]
    after = get(store, job.id)
    assert after.state == FAILED
    assert after.attempts == 1
    assert after.finished_at == at(1)


def test_fail_with_stale_token_is_ignored(store: Store) -> None:
    job = running(store)
    failure = Failure(job.id, stale(job).token, "late", at(30))
    assert store.job_finish([failure], at(1)) == []
    after = get(store, job.id)
    assert after.state == RUNNING
    assert after.error is None
    assert after.lease_token == job.lease_token


# --- running -> snooze / release -> queued ----------------------------------------


def test_snooze_queues_at_run_at_and_gives_the_attempt_back(store: Store) -> None:
    job = running(store)
    assert store.job_finish([Finish.snooze(job.id, lease_of(job).token, at(60))], at(1)) == [job.id]
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.run_at == at(60)
    assert after.attempts == 0
    assert after.lease_token is None
    assert after.finished_at is None


def test_snooze_records_snoozed_event_naming_the_attempt_that_ran(store: Store) -> None:
    job = running(store)
    store.job_finish([Finish.snooze(job.id, lease_of(job).token, at(60))], at(1))
    assert kinds(store, job.id) == ["enqueued", "claimed", "snoozed"]
    assert store.event_list(job.id)[-1].attempt == 1


def test_snoozed_job_is_claimed_again_at_run_at(store: Store) -> None:
    job = running(store)
    store.job_finish([Finish.snooze(job.id, lease_of(job).token, at(60))], at(1))
    assert claim(store, now=at(59)) == []
    again = claim_one(store, now=at(60))
    assert again.id == job.id
    assert again.attempts == 1


def test_snooze_with_cancel_pending_ends_cancelled(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(1))
    assert store.job_finish([Finish.snooze(job.id, lease_of(job).token, at(60))], at(2)) == [job.id]
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(2)
    assert kinds(store, job.id)[-1] == "cancelled"


def test_snooze_with_stale_token_is_ignored(store: Store) -> None:
    job = running(store)
    assert store.job_finish([Finish.snooze(job.id, stale(job).token, at(60))], at(1)) == []
    assert get(store, job.id).state == RUNNING
    assert get(store, job.id).attempts == 1


def test_release_queues_and_gives_the_attempt_back(store: Store) -> None:
    job = running(store, run_at=T0)
    assert store.job_finish(released([lease_of(job)]), at(5)) == [job.id]
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.attempts == 0
    assert after.lease_token is None
    assert after.run_at <= at(5)
    assert kinds(store, job.id) == ["enqueued", "claimed", "released"]
    assert store.event_list(job.id)[-1].attempt == 1
    assert claim_one(store, now=at(5)).attempts == 1


def test_release_with_cancel_pending_ends_cancelled(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(1))
    assert store.job_finish(released([lease_of(job)]), at(2)) == [job.id]
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(2)
    assert kinds(store, job.id)[-1] == "cancelled"


def test_release_with_stale_token_is_ignored(store: Store) -> None:
    job = running(store)
    assert store.job_finish(released([stale(job)]), at(1)) == []
    assert get(store, job.id).state == RUNNING


# --- running -> set_cancelled -> cancelled ----------------------------------------


def test_set_cancelled_records_cancelled(store: Store) -> None:
    job = running(store)
    assert store.job_finish(cancelled([lease_of(job)]), at(3)) == [job.id]
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(3)
    assert after.lease_token is None
    assert kinds(store, job.id) == ["enqueued", "claimed", "cancelled"]


def test_set_cancelled_with_stale_token_is_ignored(store: Store) -> None:
    job = running(store)
    assert store.job_finish(cancelled([stale(job)]), at(3)) == []
    assert get(store, job.id).state == RUNNING


# --- running: progress -------------------------------------------------------------


def test_progress_is_stored_for_a_held_lease(store: Store) -> None:
    job = running(store)
    assert store.job_progress(lease_of(job), 0.5, "half way", at(1)) is True
    after = get(store, job.id)
    assert after.progress == pytest.approx(0.5)
    assert after.progress_message == "half way"


def test_progress_with_a_stale_lease_returns_false(store: Store) -> None:
    job = running(store)
    assert store.job_progress(stale(job), 0.5, "late", at(1)) is False
    assert get(store, job.id).progress is None
    assert get(store, job.id).progress_message is None


# --- running -> rescue (lease expired) -> queued / failed ----------------------------


def test_rescue_takes_only_leases_expired_before_now(store: Store) -> None:
    enqueue(store, new_job(), new_job())
    expired = claim_one(store, now=T0)  # lease ends at(30)
    held = claim_one(store, now=at(20))  # lease ends at(50)
    assert store.job_rescue_expired(at(40)) == [expired.id]
    assert get(store, held.id).state == RUNNING
    assert get(store, held.id).lease_token == held.lease_token


def test_rescue_requeues_with_lease_lost_error(store: Store) -> None:
    job = running(store, max_attempts=3)
    assert store.job_rescue_expired(at(40)) == [job.id]
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.error == LEASE_LOST
    assert after.run_at <= at(40)
    assert after.attempts == 1
    assert after.lease_token is None and after.lease_expires_at is None
    assert after.finished_at is None
    assert kinds(store, job.id) == ["enqueued", "claimed", "rescued"]
    assert store.event_list(job.id)[-1].error == LEASE_LOST
    assert claim_one(store, now=at(40)).id == job.id


def test_rescue_out_of_attempts_fails_the_job(store: Store) -> None:
    job = running(store, max_attempts=1)
    assert store.job_rescue_expired(at(40)) == [job.id]
    after = get(store, job.id)
    assert after.state == FAILED
    assert after.error == LEASE_LOST
    assert after.finished_at == at(40)
    assert kinds(store, job.id) == ["enqueued", "claimed", "rescued", "failed"]


def test_rescue_with_cancel_pending_ends_cancelled(store: Store) -> None:
    job = running(store, max_attempts=3)
    cancel_one(store, job.id, at(1))
    assert store.job_rescue_expired(at(40)) == [job.id]
    assert get(store, job.id).state == CANCELLED
    assert kinds(store, job.id)[-2:] == ["rescued", "cancelled"]


def test_late_complete_after_rescue_is_rejected(store: Store) -> None:
    job = running(store)
    store.job_rescue_expired(at(40))
    assert complete(store, job, "late", now=at(41)) == []
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.result_json is None
    assert "succeeded" not in kinds(store, job.id)


def test_late_complete_after_rescue_does_not_overwrite_the_new_attempt(store: Store) -> None:
    job = running(store)
    store.job_rescue_expired(at(40))
    second = claim_one(store, now=at(41), worker="w2")
    assert complete(store, job, "late", now=at(42)) == []
    assert fail(store, job, now=at(42)) == []
    after = get(store, job.id)
    assert after.state == RUNNING
    assert after.worker == "w2"
    assert after.lease_token == second.lease_token
    assert complete(store, second, "mine", now=at(43)) == [job.id]
    assert get(store, job.id).result == "mine"


def test_lease_renewed_by_heartbeat_is_not_rescued(store: Store) -> None:
    job = running(store)
    store.job_heartbeat([lease_of(job)], LEASE, at(20))  # lease now ends at(50)
    assert store.job_rescue_expired(at(40)) == []
    assert get(store, job.id).state == RUNNING
    assert store.job_rescue_expired(at(51)) == [job.id]


def test_rescue_respects_limit(store: Store) -> None:
    enqueue(store, new_job(), new_job(), new_job())
    claim(store)
    assert len(store.job_rescue_expired(at(40), limit=2)) == 2
    assert len(store.job_rescue_expired(at(40), limit=2)) == 1
    assert store.job_rescue_expired(at(40)) == []


def test_rescue_leaves_queued_and_finished_jobs_alone(store: Store) -> None:
    queued = enqueue_one(store, queue="q")
    done = running(store)
    complete(store, done)
    assert store.job_rescue_expired(at(1000)) == []
    assert get(store, queued.id).state == QUEUED
    assert get(store, done.id).state == SUCCEEDED


# --- queued -> cancel -> cancelled ---------------------------------------------------


def test_cancel_queued_job_cancels_it_at_once(store: Store) -> None:
    job = enqueue_one(store)
    answer = cancel_one(store, job.id, at(2))
    assert answer is not None
    assert answer.state == CANCELLED
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(2)
    assert kinds(store, job.id) == ["enqueued", "cancelled"]
    assert claim(store, now=at(3)) == []


# --- running -> cancel -> cancelled ---------------------------------------------------


def test_cancel_running_job_requests_cancel(store: Store) -> None:
    job = running(store)
    answer = cancel_one(store, job.id, at(2))
    assert answer is not None
    assert answer.state == RUNNING
    assert answer.cancel_requested is True
    after = get(store, job.id)
    assert after.state == RUNNING and after.cancel_requested is True
    assert after.lease_token == job.lease_token
    assert kinds(store, job.id) == ["enqueued", "claimed", "cancel_requested"]


def test_cancel_running_job_then_worker_records_cancelled(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(2))
    (status,) = store.job_heartbeat([lease_of(job)], LEASE, at(3))
    assert status.cancel_requested is True
    assert store.job_finish(cancelled([lease_of(job)]), at(4)) == [job.id]
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(4)
    assert kinds(store, job.id) == ["enqueued", "claimed", "cancel_requested", "cancelled"]


def test_cancel_running_job_twice_requests_once(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(2))
    again = cancel_one(store, job.id, at(3))
    assert again is not None and again.cancel_requested is True
    assert kinds(store, job.id).count("cancel_requested") == 1


def test_fail_of_cancel_requested_job_ends_cancelled(store: Store) -> None:
    job = running(store, max_attempts=3)
    cancel_one(store, job.id, at(1))
    assert fail(store, job, now=at(2), retry_at=at(30)) == [job.id]
    after = get(store, job.id)
    assert after.state == CANCELLED
    assert after.finished_at == at(2)
    assert kinds(store, job.id)[-1] == "cancelled"


def test_complete_of_cancel_requested_job_records_success(store: Store) -> None:
    # The handler finished before it saw the request: the outcome is its own.
    job = running(store)
    cancel_one(store, job.id, at(1))
    assert complete(store, job, "done", now=at(2)) == [job.id]
    assert get(store, job.id).state == SUCCEEDED
    assert get(store, job.id).result == "done"


# --- terminal -> cancel -> (unchanged) ---------------------------------------------


@pytest.mark.parametrize("ending", ["succeeded", "failed", "cancelled"])
def test_cancel_of_finished_job_leaves_it_unchanged(store: Store, ending: str) -> None:
    job = running(store, max_attempts=1)
    if ending == "succeeded":
        complete(store, job, "kept", now=at(1))
    elif ending == "failed":
        fail(store, job, now=at(1))
    else:
        store.job_finish(cancelled([lease_of(job)]), at(1))
    events_before = kinds(store, job.id)
    answer = cancel_one(store, job.id, at(5))
    assert answer is not None
    assert answer.state == ending
    after = get(store, job.id)
    assert after.state == ending
    assert after.finished_at == at(1)
    assert after.cancel_requested is False
    assert kinds(store, job.id) == events_before
    if ending == "succeeded":
        assert after.result == "kept"


def test_cancel_of_missing_job_returns_none(store: Store) -> None:
    enqueue_one(store)
    assert cancel_one(store, 987_654, T0) is None


# --- failed / cancelled -> retry -> queued ----------------------------------------


def test_retry_of_failed_job_queues_it_with_attempts_reset(store: Store) -> None:
    job = running(store, max_attempts=1)
    fail(store, job, now=at(1), error="bad")
    answer = retry_one(store, job.id, at(100))
    assert answer is not None
    for read in (answer, get(store, job.id)):
        assert read.state == QUEUED
        assert read.attempts == 0
        assert read.run_at == at(100)
        assert read.error is None
        assert read.finished_at is None
    assert kinds(store, job.id)[-1] == "manual_retry"
    event = store.event_list(job.id)[-1]
    assert (event.attempt, event.at) == (0, at(100))
    assert claim(store, now=at(99)) == []
    assert claim_one(store, now=at(100)).attempts == 1


def test_retry_of_cancelled_job_queues_it(store: Store) -> None:
    job = enqueue_one(store)
    cancel_one(store, job.id, at(1))
    answer = retry_one(store, job.id, at(2))
    assert answer is not None and answer.state == QUEUED
    assert get(store, job.id).state == QUEUED
    assert get(store, job.id).finished_at is None
    assert kinds(store, job.id) == ["enqueued", "cancelled", "manual_retry"]


def test_retry_of_cancel_requested_job_clears_the_request(store: Store) -> None:
    job = running(store)
    cancel_one(store, job.id, at(1))
    store.job_finish(cancelled([lease_of(job)]), at(2))
    retry_one(store, job.id, at(3))
    after = get(store, job.id)
    assert after.state == QUEUED
    assert after.cancel_requested is False


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_retry_refuses_a_job_that_is_not_failed_or_cancelled(store: Store, state: str) -> None:
    job = enqueue_one(store)
    if state != "queued":
        claimed = claim_one(store)
        if state == "succeeded":
            complete(store, claimed)
    before = get(store, job.id)
    with pytest.raises(JobStateError):
        retry_one(store, job.id, at(5))
    after = get(store, job.id)
    assert after.state == state
    assert (after.attempts, after.run_at) == (before.attempts, before.run_at)
    assert "manual_retry" not in kinds(store, job.id)


def test_retry_refuses_when_another_live_job_holds_the_key(store: Store) -> None:
    old = running(store, key="k", max_attempts=1)
    fail(store, old, now=at(1))
    new = enqueue_one(store, now=at(2), key="k")
    assert new.id != old.id
    with pytest.raises(JobStateError):
        retry_one(store, old.id, at(3))
    assert get(store, old.id).state == FAILED
    assert get(store, new.id).state == QUEUED


def test_retry_of_missing_job_returns_none(store: Store) -> None:
    assert retry_one(store, 987_654, T0) is None


# --- terminal -> purge -> (deleted) -------------------------------------------------


def test_purge_deletes_terminal_jobs_finished_before_the_cutoff(store: Store) -> None:
    succeeded, failed, cancelled_job, recent, busy, queued = enqueue(
        store, *(new_job(max_attempts=1) for _ in range(6))
    )
    jobs = {j.id: j for j in claim(store, limit=4)}
    complete(store, jobs[succeeded.id], now=at(10))
    fail(store, jobs[failed.id], now=at(20))
    cancel_one(store, cancelled_job.id, at(30))
    store.job_finish(cancelled([lease_of(jobs[cancelled_job.id])]), at(30))
    complete(store, jobs[recent.id], now=at(100))
    claim(store, limit=1, now=at(100))  # busy is running, queued stays queued
    assert purge(store, at(50)) == 3
    for gone in (succeeded, failed, cancelled_job):
        assert store.job_get(gone.id) is None
        assert store.event_list(gone.id) == []
    assert {j.id for j in listed(store)} == {recent.id, queued.id, busy.id}
    # The stored log keeps the others' events (PostgreSQL names an enqueue's event
    # after its first job: the purged one took it along).
    remaining = {e.job_id for e in store.event_since(0, 1000)}
    assert recent.id in remaining
    assert not remaining & {succeeded.id, failed.id, cancelled_job.id}


def test_purge_keeps_live_jobs_whatever_the_cutoff(store: Store) -> None:
    queued = enqueue_one(store, queue="q")
    busy = running(store)
    assert purge(store, at(10_000)) == 0
    assert get(store, queued.id).state == QUEUED
    assert get(store, busy.id).state == RUNNING


def test_purge_respects_limit(store: Store) -> None:
    jobs = enqueue(store, new_job(), new_job(), new_job())
    for job in jobs:
        cancel_one(store, job.id, at(1))
    assert purge(store, at(2), limit=2) == 2
    assert len(listed(store)) == 1
    assert purge(store, at(2), limit=2) == 1
    assert purge(store, at(2), limit=2) == 0


# --- stats ---------------------------------------------------------------------


def test_stats_counts_jobs_per_queue_and_state(store: Store) -> None:
    enqueue(store, new_job(queue="a"), new_job(queue="a"), new_job(queue="a"), new_job(queue="b"))
    claim_one(store, ("a",))
    done = claim_one(store, ("b",))
    complete(store, done)
    stats = store.stats(at(1))
    assert stats.queues["a"].counts == {"queued": 2, "running": 1}
    assert stats.queues["b"].counts == {"succeeded": 1}
    assert stats.count(QUEUED) == 2
    assert stats.count(SUCCEEDED, "b") == 1
    assert stats.queues["a"].paused is False


def test_stats_oldest_ready_age_is_measured_from_run_at(store: Store) -> None:
    enqueue(
        store,
        new_job(queue="a", run_at=at(10)),
        new_job(queue="a", run_at=at(15)),
        new_job(queue="a", run_at=at(300)),
        new_job(queue="later", run_at=at(300)),
    )
    stats = store.stats(at(40))
    assert stats.queues["a"].oldest_ready_age == pytest.approx(30.0)
    assert stats.queues["later"].oldest_ready_age is None
    assert stats.queues["later"].counts == {"queued": 1}


def test_stats_oldest_ready_age_ignores_running_jobs(store: Store) -> None:
    running(store)
    assert store.stats(at(100)).queues["default"].oldest_ready_age is None


def test_stats_counts_jobs_finished_in_the_last_minute(store: Store) -> None:
    enqueue(store, new_job(), new_job(), new_job())
    first, second, _ = claim(store)
    complete(store, first, now=at(5))
    complete(store, second, now=at(50))
    assert store.stats(at(70)).finished_last_minute == 1
    assert store.stats(at(60)).finished_last_minute == 2
    assert store.stats(at(200)).finished_last_minute == 0


def test_stats_shows_a_paused_queue_with_no_jobs(store: Store) -> None:
    enqueue_one(store)
    store.queue_pause("idle", T0)
    stats = store.stats(at(1))
    assert stats.queues["idle"].paused is True
    assert stats.queues["idle"].counts == {}
    assert stats.queues["idle"].oldest_ready_age is None
    assert stats.queues["default"].paused is False


def test_stats_of_an_empty_store(store: Store) -> None:
    stats = store.stats(T0)
    assert stats.queues == {}
    assert stats.finished_last_minute == 0


# --- next_run_in ------------------------------------------------------------------


def test_next_run_in_counts_to_the_earliest_job_not_yet_due(store: Store) -> None:
    enqueue(
        store,
        new_job(queue="a", run_at=at(30)),
        new_job(queue="a", run_at=at(10)),
        new_job(queue="b", run_at=at(5)),
    )
    assert store.next_run_in(["a"], T0) == 10.0
    assert store.next_run_in(["a", "b"], T0) == 5.0
    assert store.next_run_in(["a", "b"], at(7)) == 3.0
    assert store.next_run_in(["c"], T0) is None


def test_next_run_in_ignores_jobs_already_due_and_paused_queues(store: Store) -> None:
    # A due job that was not claimed waits on a busy group or a pause: a timer set
    # to its (past) run_at would make a worker claim in a loop.
    head = running(store, queue="g", group="chat", run_at=T0)
    enqueue_one(store, queue="g", group="chat", run_at=T0)
    assert head.state == RUNNING
    assert store.job_claim(["g"], 5, "w2", LEASE, at(1)) == []
    assert store.next_run_in(["g"], at(1)) is None
    enqueue_one(store, queue="g", run_at=at(50))
    assert store.next_run_in(["g"], at(1)) == 49.0
    store.queue_pause("p", T0)
    enqueue_one(store, queue="p", run_at=at(20))
    assert store.next_run_in(["p"], T0) is None
    store.queue_resume("p", T0)
    assert store.next_run_in(["p"], T0) == 20.0


def test_next_run_in_ignores_jobs_that_are_not_queued(store: Store) -> None:
    busy = running(store, queue="r", run_at=T0)
    done = running(store, queue="d", run_at=T0)
    complete(store, done)
    enqueue_one(store, queue="r", run_at=at(20))
    assert busy.state == RUNNING
    assert store.next_run_in(["r"], T0) == 20.0
    assert store.next_run_in(["d"], T0) is None


def test_next_run_in_of_an_empty_store_is_none(store: Store) -> None:
    assert store.next_run_in(["default"], T0) is None


# --- listing ------------------------------------------------------------------


def test_listing_filters_by_state_queue_task_and_batch(store: Store) -> None:
    a, b, c, d = enqueue(
        store,
        new_job("t1", queue="q1", batch="b1"),
        new_job("t2", queue="q1", batch="b1"),
        new_job("t1", queue="q2", batch="b2"),
        new_job("t2", queue="q2"),
    )
    claim_one(store, ("q2",))  # c runs

    def ids(**fields: Any) -> list[int]:
        return [j.id for j in listed(store, **fields)]

    assert ids(state=RUNNING) == [c.id]
    assert ids(state=QUEUED) == [d.id, b.id, a.id]
    assert ids(queue="q1") == [b.id, a.id]
    assert ids(task="t1") == [c.id, a.id]
    assert ids(batch="b1") == [b.id, a.id]
    assert ids(queue="q2", task="t2") == [d.id]
    assert ids(state=SUCCEEDED) == []


def test_listing_is_newest_first_with_keyset_pagination(store: Store) -> None:
    jobs = enqueue(store, *(new_job() for _ in range(5)))
    ids = [j.id for j in reversed(jobs)]
    page1 = listed(store, limit=2)
    assert [j.id for j in page1] == ids[:2]
    page2 = listed(store, limit=2, before_id=page1[-1].id)
    assert [j.id for j in page2] == ids[2:4]
    page3 = listed(store, limit=2, before_id=page2[-1].id)
    assert [j.id for j in page3] == ids[4:]
    assert listed(store, limit=2, before_id=page3[-1].id) == []


# --- event_since -------------------------------------------------------------------


def test_event_since_returns_events_after_a_seq_in_order(store: Store) -> None:
    job = running(store)
    complete(store, job, now=at(1))
    enqueue_one(store, now=at(2))
    events = store.event_since(0, 100)
    # The stored log: a claim writes no event of its own (its start is on the
    # event that ends the attempt; event_list shows it as "claimed").
    assert [e.kind for e in events] == ["enqueued", "succeeded", "enqueued"]
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert store.event_since(seqs[0], 100) == events[1:]
    assert store.event_since(seqs[-1], 100) == []


def test_event_since_respects_limit(store: Store) -> None:
    for _ in range(5):  # one enqueue each: an event each on every store
        enqueue(store, new_job())
    events = store.event_since(0, 100)
    assert store.event_since(0, 2) == events[:2]
    assert store.event_since(events[1].seq, 2) == events[2:4]


def test_events_carry_queue_task_and_job(store: Store) -> None:
    job = running(store, task="render", queue="media")
    for event in store.event_since(0, 100):
        assert (event.job_id, event.queue, event.task) == (job.id, "media", "render")


# --- migrations --------------------------------------------------------------------


def _migration_files(store: Store) -> int:
    package = type(store).__module__.rsplit(".", 1)[0]
    folder = resources.files(package).joinpath("migrations")
    if not folder.is_dir():  # Redis keeps a layout version, with no migration files
        return store.schema_latest()
    return sum(1 for f in folder.iterdir() if re.fullmatch(r"\d{3}_\w+\.sql", f.name))


def test_migrate_is_idempotent_and_returns_the_current_version(store: Store) -> None:
    job = enqueue_one(store)
    expected = _migration_files(store)
    assert expected >= 1
    assert store.migrate() == expected
    assert store.migrate() == expected
    assert store.schema_version() == expected
    assert get(store, job.id).state == QUEUED


# --- payloads ----------------------------------------------------------------------

UNICODE_ARGS: list[Any] = [
    "héllo wörld",
    "日本語のテキスト",
    "emoji 😀 and 𝄞",
    'quotes " and \\ backslash',
    "line\nbreak\ttab",
    {"nested": [1, {"deep": [None, True, False, []]}, {}], "": "empty key"},
    2**70,
    -(2**63),
    0,
    0.1,
    -2.5,
]
UNICODE_KWARGS: dict[str, Any] = {"ключ": "значение", "z": 1, "a": [2**64, "😀"]}


def test_unicode_and_nested_payloads_round_trip(store: Store) -> None:
    job = enqueue_one(store, args=UNICODE_ARGS, kwargs=UNICODE_KWARGS)
    for read in (get(store, job.id), store.job_get_many([job.id])[0], claim_one(store)):
        assert json.loads(read.args_json) == UNICODE_ARGS
        assert json.loads(read.kwargs_json) == UNICODE_KWARGS


def test_large_ints_keep_their_exact_value(store: Store) -> None:
    values = [2**53 + 1, 2**63 - 1, 2**64, -(2**100), 10**30 + 7]
    job = enqueue_one(store, args=values)
    read = get(store, job.id).args
    assert read == values
    assert all(isinstance(v, int) for v in read)


def test_large_floats_keep_their_value(store: Store) -> None:
    # json.dumps writes these with an exponent (1e+300); read back, they must
    # still be the same numbers, not the decimal integers the text spells.
    values = [1e300, 1.7976931348623157e308, -2.5e200]
    job = enqueue_one(store, args=values)
    assert get(store, job.id).args == values


def test_floats_stay_floats(store: Store) -> None:
    values = [1e16, 1e22, 1.0, -3.0, 1.5e-10, 123456789.125, 5e-324]
    job = enqueue_one(store, args=values)
    read = get(store, job.id).args
    assert read == values
    assert [type(v) for v in read] == [float] * len(values)


def test_nul_character_in_payload_round_trips(store: Store) -> None:
    job = enqueue_one(store, args=["a\x00b"], kwargs={"k": "\x00"})
    read = get(store, job.id)
    assert read.args == ["a\x00b"]
    assert read.kwargs == {"k": "\x00"}


def test_nul_character_in_result_does_not_block_the_batch(store: Store) -> None:
    enqueue(store, new_job(), new_job())
    plain, odd = claim(store)
    ids = store.job_finish(
        [
            Finish.complete(plain.id, lease_of(plain).token, encode_json("result", "fine")),
            Finish.complete(odd.id, lease_of(odd).token, encode_json("result", "a\x00b")),
        ],
        at(1),
    )
    assert sorted(ids) == [plain.id, odd.id]
    assert get(store, plain.id).result == "fine"
    assert get(store, odd.id).result == "a\x00b"


def test_error_text_with_nul_character_is_stored(store: Store) -> None:
    # Error texts carry exception messages, which may echo arbitrary input.
    # Neither database keeps a NUL in text: it is stored as U+FFFD, the rest intact.
    job = running(store, max_attempts=1)
    assert fail(store, job, error="bad input 'a\x00b' and more") == [job.id]
    assert get(store, job.id).state == FAILED
    assert get(store, job.id).error == "bad input 'a\ufffdb' and more"


def test_error_text_with_lone_surrogate_is_stored(store: Store) -> None:
    # Not encodable as UTF-8: kept as its backslash escape rather than refused.
    job = running(store, max_attempts=1)
    assert fail(store, job, error="bad \udc80 byte") == [job.id]
    assert get(store, job.id).error == "bad \\udc80 byte"


def test_queue_named_twice_claims_as_if_named_once(store: Store) -> None:
    jobs = [enqueue_one(store) for _ in range(4)]
    claimed = claim(store, ("default", "default"), limit=3)
    assert [j.id for j in claimed] == [j.id for j in jobs[:3]]


def test_result_payload_round_trips(store: Store) -> None:
    job = running(store)
    result = {"text": "résumé 😀", "rows": [[1, "a"], [2, None]], "big": 2**80, "f": 0.25}
    complete(store, job, result)
    assert get(store, job.id).result == result


def test_unicode_names_round_trip(store: Store) -> None:
    job = enqueue_one(
        store, task="résumé.render", queue="files-ü", key="clé-😀", group="群", batch="партия"
    )
    again = enqueue_one(store, task="résumé.render", queue="files-ü", key="clé-😀")
    assert again.id == job.id
    read = get(store, job.id)
    assert (read.task, read.queue, read.key, read.group, read.batch) == (
        "résumé.render",
        "files-ü",
        "clé-😀",
        "群",
        "партия",
    )
    assert [j.id for j in claim(store, ("files-ü",), group="群")] == [job.id]
    assert [j.id for j in listed(store, batch="партия")] == [job.id]


# --- times --------------------------------------------------------------------------


def test_times_round_trip_to_the_microsecond(store: Store) -> None:
    plus_five_thirty = timezone(timedelta(hours=5, minutes=30))
    run_at = datetime(2026, 1, 1, 10, 0, 1, 234_567, tzinfo=plus_five_thirty)
    now = T0 + timedelta(microseconds=1)
    job = enqueue_one(store, now=now, run_at=run_at)
    read = get(store, job.id)
    assert read.run_at == run_at
    assert read.created_at == now


def test_lease_and_finish_times_round_trip_to_the_microsecond(store: Store) -> None:
    enqueue_one(store)
    claim_at = at(3.000_001)
    job = claim_one(store, now=claim_at, lease=timedelta(microseconds=999_999))
    complete(store, job, now=at(3.500_003))
    read = get(store, job.id)
    assert read.started_at == claim_at
    assert read.finished_at == at(3.500_003)
    assert job.lease_expires_at == claim_at + timedelta(microseconds=999_999)
    assert [e.at for e in store.event_list(job.id)] == [T0, claim_at, at(3.500_003)]


def test_times_come_back_timezone_aware(store: Store) -> None:
    job = running(store)
    read = get(store, job.id)
    for value in (read.run_at, read.created_at, read.started_at, read.lease_expires_at):
        assert value is not None and value.tzinfo is not None
        assert value.utcoffset() == timedelta(0)
