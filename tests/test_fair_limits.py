"""Fair turns together with limits (app.fair and app.limit on one queue), on every
store: the limits hold (the queue's room caps each claim, each key's room its
jobs, throttles hold) and, within them, the keys still take turns; counted,
never timed."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from conveyor import App
from conveyor.job import Job, NewJob, utcnow
from conveyor.store.finish_fetch import FetchNext, FinishFetchStore
from conveyor.store.records import Finish

LEASE = timedelta(minutes=5)


def _jobs(key: str, count: int) -> list[NewJob]:
    now = utcnow()
    return [
        NewJob(task="t", queue="q", limit_key=key, args_json="[]", kwargs_json="{}", run_at=now)
        for _ in range(count)
    ]


def _claim(app: App, limit: int) -> list[Job]:
    return app.store.job_claim(["q"], limit, "w", LEASE)


def _complete(app: App, jobs: list[Job]) -> None:
    finishes = [Finish(j.id, j.lease_token or "", "complete") for j in jobs]
    assert sorted(app.store.job_finish(finishes)) == sorted(j.id for j in jobs)


def _keys(jobs: list[Job]) -> Counter[str | None]:
    return Counter(j.limit_key for j in jobs)


def test_a_queue_concurrency_caps_each_claim_and_the_keys_take_turns(app: App) -> None:
    app.limit("q", concurrency=6)
    app.fair("q")
    app.enqueue_many(_jobs("A", 500))
    first = _claim(app, 20)
    assert _keys(first) == {"A": 6}
    assert _claim(app, 20) == []  # full: six running
    _complete(app, first)
    app.enqueue_many(_jobs("B", 30) + _jobs("C", 30))
    started: Counter[str | None] = Counter()
    for _ in range(15):  # 15 claims of 6: 90 starts, a third each
        got = _claim(app, 20)
        assert len(got) == 6
        started.update(_keys(got))
        _complete(app, got)
    assert started == {"A": 30, "B": 30, "C": 30}, started


def test_a_per_key_concurrency_gives_each_key_its_room_by_turns(app: App) -> None:
    app.limit("q", concurrency=5, per_key=True)
    app.fair("q")
    app.enqueue_many(_jobs("A", 200) + _jobs("B", 200) + _jobs("C", 200))
    # The oldest first would be five of A and one of B: the turns give two each.
    assert _keys(_claim(app, 6)) == {"A": 2, "B": 2, "C": 2}
    assert _keys(_claim(app, 30)) == {"A": 3, "B": 3, "C": 3}  # the rest of each room
    assert _claim(app, 30) == []


def test_a_per_key_rate_counts_the_starts_of_fair_claims(app: App) -> None:
    app.limit("q", rate="4/m", per_key=True)
    app.fair("q", weights={"A": 3})
    app.enqueue_many(_jobs("A", 100) + _jobs("B", 100))
    got = _claim(app, 4)
    assert _keys(got) == {"A": 3, "B": 1}  # weighted turns
    _complete(app, got)
    # Each key had its turns up to its rate: 4 starts a minute, running or not.
    assert _keys(_claim(app, 50)) == {"A": 1, "B": 3}
    assert _claim(app, 50) == []


def test_a_queue_rate_spreads_its_starts_over_the_keys(app: App) -> None:
    app.limit("q", rate="9/m")
    app.fair("q")
    app.enqueue_many(_jobs("A", 300))
    app.enqueue_many(_jobs("B", 10) + _jobs("C", 10))
    got = _claim(app, 50)
    assert _keys(got) == {"A": 3, "B": 3, "C": 3}
    _complete(app, got)
    assert _claim(app, 50) == []  # the minute's nine starts are used


def test_a_throttled_key_waits_while_the_others_take_turns(app: App) -> None:
    app.limit("q", concurrency=100)
    app.fair("q")
    app.enqueue_many(_jobs("A", 50) + _jobs("B", 50) + _jobs("C", 50))
    app.throttle("q", 60, limit_key="A")
    assert _keys(_claim(app, 10)) == {"B": 5, "C": 5}
    app.throttle("q", 60)  # the whole queue
    assert _claim(app, 10) == []


def test_groups_holds_and_pauses_hold_with_limits_too(app: App) -> None:
    app.limit("q", concurrency=3, per_key=True)
    app.fair("q")
    grouped = app.enqueue_many(_jobs("A", 5))
    app.enqueue_many(
        [
            NewJob(task="t", queue="q", limit_key="B", group="g", args_json="[]",
                   kwargs_json="{}", run_at=utcnow())
            for _ in range(4)
        ]
    )  # fmt: skip
    held = app.enqueue_many(_jobs("C", 4))
    for job in held[2:]:
        app.hold(job.id)
    got = _claim(app, 20)
    # A within its room of 3; one job of B's group at a time; C's two not held.
    assert _keys(got) == {"A": 3, "B": 1, "C": 2}
    assert {j.id for j in got if j.limit_key == "A"} == {j.id for j in grouped[:3]}
    app.pause("q")
    _complete(app, got)
    assert _claim(app, 20) == []
    app.resume("q")
    assert _keys(_claim(app, 20)) == {"A": 2, "B": 1}


@pytest.mark.parametrize("dsn", ["redis"], indirect=True)  # the store with FinishFetchStore
def test_a_finish_that_fetches_the_next_jobs_takes_them_by_turns(app: App) -> None:
    assert isinstance(app.store, FinishFetchStore)
    app.fair("q")
    app.enqueue_many(_jobs("A", 300))
    first = _claim(app, 6)
    app.enqueue_many(_jobs("B", 30) + _jobs("C", 30))
    finishes = [Finish(j.id, j.lease_token or "", "complete") for j in first]
    ids, fetched = app.store.job_finish_fetch(finishes, FetchNext(("q",), 6, "w", LEASE))
    assert sorted(ids) == sorted(j.id for j in first)
    # The plain claim's rule would fetch six more of A; A's turns are six ahead.
    assert _keys(fetched) == {"B": 3, "C": 3}
