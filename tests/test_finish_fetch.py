"""A Redis finish that claims the next jobs in the same script (FinishFetchStore).

The fetch is the claim's own rule (common.lua's ``claim``), run after the
outcomes: what a claim honours (pauses, limits, groups, holds, priorities) the
fetch honours, and the worker starts what it fetched as it starts what it
claims, never beyond its slots, never leaving a fetched job stranded when it
stops.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from conveyor import App, JobState
from conveyor.job import Job, NewJob, utcnow
from conveyor.limits import Limit, Rate
from conveyor.store.finish_fetch import FetchNext, FinishFetchStore
from conveyor.store.records import Finish, LimitChange
from conveyor.store.redis import RedisStore
from waiting import wait_until

LEASE = timedelta(seconds=60)
DEADLINE = 30.0


def new_job(queue: str = "q", priority: int = 0, group: str | None = None) -> NewJob:
    return NewJob(
        queue=queue,
        task="t",
        args_json="[]",
        kwargs_json="{}",
        run_at=utcnow(),
        priority=priority,
        group=group,
    )


@pytest.fixture
def store(redis_clean_dsn: str) -> Any:
    opened = RedisStore(redis_clean_dsn, migrate=True)
    yield opened
    opened.close()


def fetch(limit: int, queues: tuple[str, ...] = ("q",)) -> FetchNext:
    return FetchNext(queues, limit, "w2", LEASE)


def complete(job: Job) -> Finish:
    assert job.lease_token is not None
    return Finish(job.id, job.lease_token, "complete", result_json="null")


# --- the store ---------------------------------------------------------------------------


def test_the_finish_claims_the_next_jobs_under_a_fresh_lease(store: RedisStore) -> None:
    assert isinstance(store, FinishFetchStore)
    a, high, b, other = store.job_insert_many(
        [new_job(), new_job(priority=5), new_job(), new_job(queue="elsewhere")], utcnow()
    )
    first = store.job_claim(["q"], 1, "w1", LEASE)[0]
    assert first.id == high.id  # the claim's order: priority first

    ids, fetched = store.job_finish_fetch([complete(first)], fetch(5))

    assert ids == [first.id]
    assert store.job_get(first.id).state == JobState.SUCCEEDED  # type: ignore[union-attr]
    # The two other jobs of "q", in claim order; none of the queue not asked for.
    assert [j.id for j in fetched] == [a.id, b.id]
    for job in fetched:
        assert job.state == JobState.RUNNING
        assert job.worker == "w2" and job.attempts == 1
        assert job.lease_token and job.lease_token != first.lease_token
        stored = store.job_get(job.id)
        assert stored is not None and stored.lease_token == job.lease_token
    assert store.job_get(other.id).state == JobState.QUEUED  # type: ignore[union-attr]


def test_a_stale_finish_still_fetches_and_changes_nothing(store: RedisStore) -> None:
    store.job_insert_many([new_job(), new_job()], utcnow())
    first = store.job_claim(["q"], 1, "w1", LEASE)[0]
    stale = Finish(first.id, "not-the-token", "complete", result_json="null")
    ids, fetched = store.job_finish_fetch([stale], fetch(1))
    assert ids == []
    assert store.job_get(first.id).state == JobState.RUNNING  # type: ignore[union-attr]
    assert len(fetched) == 1 and fetched[0].id != first.id


def test_a_fetch_of_none_is_a_plain_finish(store: RedisStore) -> None:
    store.job_insert_many([new_job(), new_job()], utcnow())
    first = store.job_claim(["q"], 1, "w1", LEASE)[0]
    assert store.job_finish_fetch([complete(first)], fetch(0)) == ([first.id], [])
    assert store.job_finish_fetch([], fetch(0)) == ([], [])


def test_the_fetch_honours_a_pause(store: RedisStore) -> None:
    store.job_insert_many([new_job(), new_job()], utcnow())
    first = store.job_claim(["q"], 1, "w1", LEASE)[0]
    store.queue_pause("q", utcnow())
    assert store.job_finish_fetch([complete(first)], fetch(5)) == ([first.id], [])


def test_the_fetch_takes_the_groups_next_job_once_the_finish_frees_it(store: RedisStore) -> None:
    a1, a2, b1 = store.job_insert_many(
        [new_job(group="a"), new_job(group="a"), new_job(group="b")], utcnow()
    )
    running = store.job_claim(["q"], 5, "w1", LEASE)
    assert [j.id for j in running] == [a1.id, b1.id]  # one of each group at a time
    by_id = {j.id: j for j in running}
    # b's end frees nothing of a's: a1 still runs.
    assert store.job_finish_fetch([complete(by_id[b1.id])], fetch(5)) == ([b1.id], [])
    # a1's end makes a2 the head, none of a running: the same script takes it.
    ids, fetched = store.job_finish_fetch([complete(by_id[a1.id])], fetch(5))
    assert ids == [a1.id] and [j.id for j in fetched] == [a2.id]


def test_the_fetch_honours_a_concurrency_limit(store: RedisStore) -> None:
    store.limit_set(LimitChange("q", Limit(concurrency=2)), utcnow())
    store.job_insert_many([new_job() for _ in range(5)], utcnow())
    one, _two = store.job_claim(["q"], 5, "w1", LEASE)
    _, fetched = store.job_finish_fetch([complete(one)], fetch(5))
    assert len(fetched) == 1  # two and the fetched one: the limit's two
    assert store.job_claim(["q"], 5, "w1", LEASE) == []


def test_the_fetch_honours_a_rate_and_a_limit_keys_concurrency(store: RedisStore) -> None:
    # One at a time per key; two starts a minute in r.
    store.limit_set(LimitChange("q", Limit(concurrency=1), per_key=True), utcnow())
    store.limit_set(LimitChange("r", Limit(rate=Rate(2, 60.0))), utcnow())
    a1, a2, a3, b1 = store.job_insert_many(
        [replace(new_job(), limit_key=k) for k in ("a", "a", "a", "b")], utcnow()
    )
    r1, r2, r3 = store.job_insert_many([new_job(queue="r") for _ in range(3)], utcnow())
    first = store.job_claim(["q"], 1, "w1", LEASE)[0]
    assert first.id == a1.id
    _, fetched = store.job_finish_fetch([complete(first)], fetch(5))
    assert sorted(j.id for j in fetched) == [a2.id, b1.id]  # a1's end frees key a, once
    assert store.job_get(a3.id).state == JobState.QUEUED  # type: ignore[union-attr]
    started = store.job_claim(["r"], 1, "w1", LEASE)[0]
    _, fetched = store.job_finish_fetch([complete(started)], fetch(5, ("r",)))
    assert [j.id for j in fetched] == [r2.id]  # the window's second start, not a third
    assert store.job_get(r3.id).state == JobState.QUEUED  # type: ignore[union-attr]
    assert started.id == r1.id


def test_the_fetch_passes_held_jobs_over(store: RedisStore) -> None:
    first, held, free = store.job_insert_many([new_job(), new_job(), new_job()], utcnow())
    assert store.job_hold([held.id], utcnow()) == [held.id]
    claimed = store.job_claim(["q"], 1, "w1", LEASE)[0]
    assert claimed.id == first.id
    _, fetched = store.job_finish_fetch([complete(claimed)], fetch(5))
    assert [j.id for j in fetched] == [free.id]


def test_a_retried_job_may_come_back_in_the_same_script(store: RedisStore) -> None:
    (only,) = store.job_insert_many([new_job()], utcnow())
    claimed = store.job_claim(["q"], 1, "w1", LEASE)[0]
    assert claimed.lease_token is not None
    retry = Finish(claimed.id, claimed.lease_token, "retry", error="boom", run_at=utcnow())
    ids, fetched = store.job_finish_fetch([retry], fetch(1))
    assert ids == [only.id]
    assert [(j.id, j.attempts) for j in fetched] == [(only.id, 2)]
    assert fetched[0].lease_token != claimed.lease_token
    assert "retried" in [e.kind for e in store.event_list(only.id)]


# --- the worker --------------------------------------------------------------------------


def counting_fetches(app: App) -> list[int]:
    """The number of jobs each finish fetched, wrapped around the store's own method."""
    fetched: list[int] = []
    original = app.store.job_finish_fetch  # type: ignore[attr-defined]

    def counted(*args: Any, **kwargs: Any) -> Any:
        ids, jobs = original(*args, **kwargs)
        fetched.append(len(jobs))
        return ids, jobs

    app.store.job_finish_fetch = counted  # type: ignore[attr-defined]
    return fetched


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_fetched_jobs_run_once_each_within_the_slots(redis_clean_dsn: str, kind: str) -> None:
    concurrency, count = 4, 300
    lock = threading.Lock()
    ran: list[int] = []
    now_running = [0]
    most = [0]

    def enter(n: int) -> None:
        with lock:
            ran.append(n)
            now_running[0] += 1
            most[0] = max(most[0], now_running[0])

    def leave() -> None:
        with lock:
            now_running[0] -= 1

    with App(redis_clean_dsn) as app:
        app.migrate()
        if kind == "sync":

            @app.task(queue="q", name="work")
            def work(n: int) -> None:
                enter(n)
                time.sleep(0.001)
                leave()

        else:

            @app.task(queue="q", name="work")
            async def awork(n: int) -> None:
                enter(n)
                leave()

        fetched = counting_fetches(app)
        handles = app.tasks["work"].enqueue_many([((n,), {}) for n in range(count)])
        app.run_worker(
            queues=["q"], concurrency=concurrency, burst=True, maintenance=False, finish_fetch=True
        )

        assert sorted(ran) == list(range(count))  # each once
        assert most[0] <= concurrency
        assert sum(fetched) > count // 2, fetched  # most jobs came with a finish
        jobs = app.store.job_get_many([h.id for h in handles])
        assert {(j.state, j.attempts) for j in jobs} == {(JobState.SUCCEEDED, 1)}


def test_a_stopping_worker_fetches_nothing_and_leaves_nothing_running(
    redis_clean_dsn: str,
) -> None:
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q")
        def nap() -> None:
            time.sleep(0.005)

        fetched = counting_fetches(app)
        handles = nap.enqueue_many([((), {})] * 400)
        options = {"concurrency": 3, "maintenance": False, "finish_fetch": True}
        worker = app.worker(queues=["q"], **options).start()
        wait_until(lambda: sum(fetched) >= 20, what="jobs fetched by finishes")
        worker.stop()
        assert worker.wait_stopped(DEADLINE)
        jobs = app.store.job_get_many([h.id for h in handles])
        assert not [j.id for j in jobs if j.state == JobState.RUNNING]
        # What did not run is queued with no attempt spent; what ran, ran once.
        assert {(j.state, j.attempts) for j in jobs} == {
            (JobState.SUCCEEDED, 1),
            (JobState.QUEUED, 0),
        }


def test_jobs_fetched_as_the_worker_stops_are_given_back_at_once(redis_clean_dsn: str) -> None:
    """A finish asked to fetch before the stop, answered after it: its jobs are released."""
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q")
        def noop() -> None:
            return None

        first, second = noop.enqueue_many([((), {})] * 2)
        store = app.store
        assert isinstance(store, FinishFetchStore)
        worker = app.worker(queues=["q"], concurrency=2, maintenance=False)
        late = store.job_claim(["q"], 1, worker.id, LEASE)  # as a finish's fetch would
        assert [j.id for j in late] == [first.id]
        worker._stopping.set()  # the stop came while that finish was on its way
        worker._fetching = 1
        worker._fetched(late, 1)
        assert worker._fetching == 0
        worker.start()  # stopping already: it drains what it holds and exits
        assert worker.wait_stopped(DEADLINE)
        job = app.get(first.id)
        assert (job.state, job.attempts) == (JobState.QUEUED, 0)
        assert app.get(second.id).state == JobState.QUEUED
