"""Redis: a workflow's job whose hash is lost (deleted by hand, evicted) never
leaves the jobs that wait for it waiting forever.

Whoever meets such a job drops it (see test_redis_repair.py); a dropped job
that had not ended resolves the edges onto it as a lost parent does: its
waiting children are cancelled with an error that names it (or, with
``after_failure="run"``, run once their other parents ended), and theirs in
turn. These tests delete hashes on a real redis-server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from conveyor.job import Job, JobState, NewJob, utcnow
from conveyor.store.dsn import open_store
from conveyor.store.records import Finish
from conveyor.store.redis import RedisStore

pytestmark = pytest.mark.redis

P = "{conveyor}:"
LEASE = timedelta(seconds=30)
LOST = "which this job waits for, was dropped (its data was deleted or evicted)"


@pytest.fixture
def store(redis_clean_dsn: str) -> Iterator[RedisStore]:
    opened = open_store(redis_clean_dsn)
    assert isinstance(opened, RedisStore)
    opened.migrate()
    yield opened
    opened.close()


@pytest.fixture
def client(redis_clean_dsn: str) -> Iterator[Any]:
    connection = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
    yield connection
    connection.close()


def new_job(**fields: Any) -> NewJob:
    job = NewJob(queue="q", task="t", args_json="[]", kwargs_json="{}", run_at=utcnow())
    return dataclasses.replace(job, **fields)


def one(store: RedisStore, **fields: Any) -> Job:
    return store.job_insert_many([new_job(**fields)], utcnow())[0]


def state(store: RedisStore, job: Job) -> tuple[str, str | None]:
    found = store.job_get(job.id)
    assert found is not None
    return found.state.value, found.error


def complete(store: RedisStore, job: Job) -> list[int]:
    return store.job_finish([Finish.complete(job.id, job.lease_token or "", 1)])


def test_a_queued_parent_dropped_at_its_run_time_resolves_its_children(
    store: RedisStore, client: Any
) -> None:
    parent, other = one(store), one(store)
    child = one(store, after=(parent.id,))
    grandchild = one(store, after=(child.id,))
    anyway = one(store, after=(parent.id, other.id), after_failure="run")
    client.delete(f"{P}job:{parent.id}")

    claimed = store.job_claim(["q"], 10, "w", LEASE)

    assert [j.id for j in claimed] == [other.id]
    assert state(store, child) == ("cancelled", f"job {parent.id}, {LOST}")
    assert state(store, grandchild) == ("cancelled", f"job {child.id}, which this job waits "
                                                     "for, was cancelled")  # fmt: skip
    assert state(store, anyway) == ("waiting", None)  # still waits for the other parent
    assert complete(store, claimed[0]) == [other.id]
    assert state(store, anyway) == ("queued", None)


def test_a_running_parent_dropped_at_its_finish_resolves_its_children(
    store: RedisStore, client: Any
) -> None:
    parent = one(store)
    child = one(store, after=(parent.id,))
    (running,) = store.job_claim(["q"], 10, "w", LEASE)
    client.delete(f"{P}job:{parent.id}")

    assert complete(store, running) == []  # nothing to record the result in

    assert state(store, child) == ("cancelled", f"job {parent.id}, {LOST}")
    assert store.job_claim(["q"], 10, "w", LEASE) == []


def test_a_running_parent_dropped_and_never_finished_resolves_its_children_at_rescue(
    store: RedisStore, client: Any
) -> None:
    parent = one(store)
    child = one(store, after=(parent.id,), after_failure="run")
    store.job_claim(["q"], 10, "w", LEASE)
    client.delete(f"{P}job:{parent.id}")

    store.job_rescue_expired(utcnow() + LEASE + timedelta(seconds=1))

    assert state(store, child) == ("queued", None)


def test_a_waiting_middle_job_of_a_chain_dropped_resolves_the_rest(
    store: RedisStore, client: Any
) -> None:
    first = one(store)
    middle = one(store, after=(first.id,))
    last = one(store, after=(middle.id,))
    after_last = one(store, after=(last.id,))
    client.delete(f"{P}job:{middle.id}")
    (running,) = store.job_claim(["q"], 10, "w", LEASE)

    assert complete(store, running) == [first.id]

    assert state(store, last) == ("cancelled", f"job {middle.id}, {LOST}")
    assert state(store, after_last)[0] == JobState.CANCELLED.value
    assert store.job_claim(["q"], 10, "w", LEASE) == []
    assert client.exists(f"{P}wp:{middle.id}") == 0


def test_a_succeeded_parent_whose_hash_is_gone_is_named_to_its_child(
    store: RedisStore, client: Any
) -> None:
    done, later = one(store), one(store, run_at=utcnow() + timedelta(hours=1))
    child = one(store, after=(done.id, later.id))
    (running,) = store.job_claim(["q"], 10, "w", LEASE)
    assert complete(store, running) == [done.id]
    client.delete(f"{P}job:{done.id}")

    edges = [(r.id, r.job is None, r.resolved) for r in store.job_parents(child.id)]

    assert edges == [(done.id, True, "dropped"), (later.id, False, None)]
