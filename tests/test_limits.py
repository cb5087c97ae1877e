"""Flow control: rate and concurrency limits, per queue and per limit key, on every backend.

The store tests run once per backend through the ``store`` fixture on a fixed
clock (T0 plus an offset), as the store contract does. The App tests check
what users write and the errors they get; the fleet tests, with real worker
processes, are in test_limits_fleet.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, ConfigurationError, InvalidJobError
from conveyor.job import Job, NewJob
from conveyor.limits import Limit, Rate, parse_rate
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, LimitChange

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def enqueue(
    store: Store,
    count: int,
    *,
    queue: str = "api",
    limit_key: str | None = None,
    group: str | None = None,
    priority: int = 0,
    run_at: datetime = T0,
) -> list[Job]:
    jobs = [
        NewJob(
            queue=queue,
            task="call",
            args_json="[]",
            kwargs_json="{}",
            run_at=run_at,
            priority=priority,
            limit_key=limit_key,
            group=group,
        )
        for _ in range(count)
    ]
    return store.job_insert_many(jobs, T0)


def claim(
    store: Store, seconds: float, limit: int = 100, queues: tuple[str, ...] = ("api",)
) -> list[Job]:
    return store.job_claim(list(queues), limit, "w1", LEASE, at(seconds))


def finish(store: Store, jobs: list[Job], seconds: float) -> None:
    done = store.job_finish(
        [Finish.complete(j.id, j.lease_token or "", "null") for j in jobs], at(seconds)
    )
    assert sorted(done) == sorted(j.id for j in jobs)


def set_limit(
    store: Store,
    queue: str = "api",
    *,
    rate: str | None = None,
    concurrency: int | None = None,
    per_key: bool = False,
) -> None:
    limit = Limit(rate=parse_rate(rate) if rate else None, concurrency=concurrency)
    store.limit_set(LimitChange(queue, limit, per_key), T0)


# --- the rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "per"),
    [
        ("10/s", 10, 1.0),
        ("600/m", 600, 60.0),
        ("1000/h", 1000, 3600.0),
        ("5/10s", 5, 10.0),
        (" 3 / minute ", 3, 60.0),
        ("2/1.5s", 2, 1.5),
        ("1/d", 1, 86400.0),
    ],
)
def test_rates_are_read_from_text(text: str, count: int, per: float) -> None:
    assert parse_rate(text) == Rate(count, per)


@pytest.mark.parametrize(
    "text", ["10", "10/", "/s", "ten/s", "10/fortnight", "0/s", "-1/s", "5/0s"]
)
def test_a_rate_that_cannot_be_read_or_is_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="rate"):
        parse_rate(text)


def test_rates_print_as_they_are_written() -> None:
    assert [str(parse_rate(t)) for t in ("10/s", "600/m", "1000/h", "5/10s")] == [
        "10/s",
        "600/m",
        "1000/h",
        "5/10s",
    ]


# --- rate -------------------------------------------------------------------------------


def test_a_rate_lets_that_many_start_in_any_window_and_then_slides(store: Store) -> None:
    enqueue(store, 20)
    set_limit(store, rate="3/s")
    assert len(claim(store, 0.0, limit=2)) == 2
    assert len(claim(store, 0.6)) == 1  # the third of the window
    assert claim(store, 0.9) == []
    # A sliding window, not a fixed second: at 1.05 the starts of 0.0 have left it,
    # the one of 0.6 has not.
    assert len(claim(store, 1.05)) == 2
    assert claim(store, 1.5) == []
    assert len(claim(store, 1.65)) == 1


def test_a_full_rate_window_tells_when_the_next_job_may_start(store: Store) -> None:
    enqueue(store, 10)
    set_limit(store, rate="2/s")
    claim(store, 0.0, limit=1)
    claim(store, 0.4, limit=1)
    assert claim(store, 0.5) == []
    # The second newest start (0.0) leaves the window at 1.0.
    assert store.next_run_in(["api"], at(0.5)) == pytest.approx(0.5, abs=1e-3)


def test_the_next_moment_counts_the_jobs_of_each_claim(store: Store) -> None:
    enqueue(store, 10)
    set_limit(store, rate="3/s")
    claim(store, 0.0, limit=2)  # two starts at 0.0, recorded as one claim
    claim(store, 0.4, limit=5)  # room for one
    assert store.next_run_in(["api"], at(0.5)) == pytest.approx(0.5, abs=1e-3)
    assert len(claim(store, 1.0)) == 2  # the two of 0.0 left the window
    assert store.next_run_in(["api"], at(1.1)) == pytest.approx(0.3, abs=1e-3)


def test_a_queue_with_room_and_ready_jobs_says_now(store: Store) -> None:
    enqueue(store, 3)
    set_limit(store, rate="10/s")
    # A claim that lost the race for the limit took nothing; the worker asks again.
    assert store.next_run_in(["api"], at(0.0)) == 0.0


def test_unlimited_queues_in_the_same_claim_are_not_held(store: Store) -> None:
    enqueue(store, 5)
    enqueue(store, 5, queue="free")
    set_limit(store, rate="1/s")
    taken = claim(store, 0.0, limit=10, queues=("api", "free"))
    assert sorted(j.queue for j in taken) == ["api"] + ["free"] * 5


def test_a_claim_takes_the_best_jobs_within_the_room(store: Store) -> None:
    low = enqueue(store, 3, priority=0)
    high = enqueue(store, 2, priority=5)
    set_limit(store, rate="3/s")
    taken = claim(store, 0.0)
    assert [j.id for j in taken] == [high[0].id, high[1].id, low[0].id]


# --- concurrency ------------------------------------------------------------------------


def test_a_concurrency_limit_counts_running_jobs(store: Store) -> None:
    enqueue(store, 10)
    set_limit(store, concurrency=3)
    first = claim(store, 0.0, limit=2)
    assert len(first) == 2
    assert len(claim(store, 0.1)) == 1
    assert claim(store, 0.2) == []
    # A full concurrency limit has no moment: a job that ends wakes the workers.
    assert store.next_run_in(["api"], at(0.2)) is None
    finish(store, first, 0.3)
    assert len(claim(store, 0.4)) == 2


def test_a_rescued_or_released_job_frees_its_slot(store: Store) -> None:
    enqueue(store, 5)
    set_limit(store, concurrency=1)
    (job,) = claim(store, 0.0)
    store.job_finish([Finish.release(job.id, job.lease_token or "")], at(1))
    (again,) = claim(store, 2.0)
    assert claim(store, 2.1) == []
    assert store.job_rescue_expired(at(100)) == [again.id]
    assert len(claim(store, 101)) == 1


def test_a_paused_limited_queue_gives_nothing(store: Store) -> None:
    enqueue(store, 3)
    set_limit(store, concurrency=5)
    store.queue_pause("api", T0)
    assert claim(store, 0.0) == []
    assert store.next_run_in(["api"], at(0.0)) is None
    store.queue_resume("api", T0)
    assert len(claim(store, 0.1)) == 3


def test_groups_keep_their_order_inside_a_limited_queue(store: Store) -> None:
    jobs = enqueue(store, 3, group="g")
    set_limit(store, concurrency=10)
    assert [j.id for j in claim(store, 0.0)] == [jobs[0].id]
    # The group is busy: no "now" for a job that its group holds.
    assert store.next_run_in(["api"], at(0.0)) is None


# --- per key ---------------------------------------------------------------------------


def test_a_per_key_limit_applies_to_each_key_apart(store: Store) -> None:
    for key in ("a", "b"):
        enqueue(store, 5, limit_key=key)
    enqueue(store, 2)  # no key: not held by the per-key limit
    set_limit(store, concurrency=1, per_key=True)
    taken = claim(store, 0.0)
    assert sorted(str(j.limit_key) for j in taken) == ["None", "None", "a", "b"]
    assert claim(store, 0.1) == []
    finish(store, [j for j in taken if j.limit_key == "a"], 0.2)
    assert [j.limit_key for j in claim(store, 0.3)] == ["a"]


def test_a_per_key_rate_slides_per_key(store: Store) -> None:
    enqueue(store, 4, limit_key="a")
    enqueue(store, 4, limit_key="b")
    set_limit(store, rate="2/s", per_key=True)
    assert sorted(j.limit_key or "" for j in claim(store, 0.0, limit=3)) == ["a", "a", "b"]
    assert [j.limit_key for j in claim(store, 0.5)] == ["b"]
    assert claim(store, 0.6) == []
    assert store.next_run_in(["api"], at(0.6)) == pytest.approx(0.4, abs=1e-3)
    # At 1.0 the starts of 0.0 have left the window: "a" has room for two, "b" for one.
    assert sorted(j.limit_key or "" for j in claim(store, 1.0)) == ["a", "a", "b"]


def test_a_key_over_its_limit_does_not_hold_other_keys_back(store: Store) -> None:
    # The first ten jobs in claim order are all of key "busy".
    enqueue(store, 10, limit_key="busy", priority=5)
    enqueue(store, 3, limit_key="calm")
    set_limit(store, concurrency=1, per_key=True)
    first = claim(store, 0.0, limit=2)
    assert [j.limit_key for j in first] == ["busy", "calm"]
    # "busy" is at its limit: its nine waiting jobs are passed over.
    assert claim(store, 0.1, limit=2) == []
    assert store.next_run_in(["api"], at(0.1)) is None


def test_a_keys_jobs_that_are_not_due_do_not_take_its_room(store: Store) -> None:
    # Three older jobs of key "a" are due in an hour; two newer ones are due now.
    enqueue(store, 3, limit_key="a", run_at=at(3600))
    due = enqueue(store, 2, limit_key="a")
    set_limit(store, concurrency=3, per_key=True)
    assert sorted(j.id for j in claim(store, 0.0)) == sorted(j.id for j in due)


def test_queue_and_key_limits_hold_together(store: Store) -> None:
    for key in "abcd":
        enqueue(store, 3, limit_key=key)
    set_limit(store, concurrency=3)
    set_limit(store, concurrency=1, per_key=True)
    taken = claim(store, 0.0)
    assert len(taken) == 3
    assert len({j.limit_key for j in taken}) == 3


# --- throttles -------------------------------------------------------------------------


def test_a_throttled_queue_starts_nothing_until_the_throttle_ends(store: Store) -> None:
    enqueue(store, 3)
    until = store.limit_throttle("api", None, 30, at(0))
    assert until == at(30)
    assert claim(store, 10) == []
    assert store.next_run_in(["api"], at(10)) == pytest.approx(20, abs=1e-3)
    # A shorter throttle does not shorten it.
    assert store.limit_throttle("api", None, 5, at(10)) == at(30)
    assert len(claim(store, 30.5)) == 3


def test_a_throttled_key_holds_back_only_its_own_jobs(store: Store) -> None:
    enqueue(store, 2, limit_key="a")
    enqueue(store, 2, limit_key="b")
    store.limit_throttle("api", "a", 10, at(0))
    assert sorted(j.limit_key or "" for j in claim(store, 1)) == ["b", "b"]
    assert store.next_run_in(["api"], at(1)) == pytest.approx(9, abs=1e-3)
    assert sorted(j.limit_key or "" for j in claim(store, 10.5)) == ["a", "a"]


def test_a_throttle_can_be_lifted(store: Store) -> None:
    enqueue(store, 1)
    store.limit_throttle("api", None, 60, at(0))
    store.limit_throttle("api", None, 0, at(1))
    assert len(claim(store, 2)) == 1
    assert store.limit_get("api") is None  # nothing left: the plain claim again


# --- changing limits at run time --------------------------------------------------------


def test_limits_are_set_per_scope_and_cleared(store: Store) -> None:
    set_limit(store, rate="10/s", concurrency=2)
    set_limit(store, concurrency=1, per_key=True)
    got = store.limit_get("api")
    assert got is not None
    assert got.limit == Limit(Rate(10, 1.0), 2)
    assert got.key_limit == Limit(None, 1)
    store.limit_set(LimitChange("api", None), T0)
    got = store.limit_get("api")
    assert got is not None and got.limit is None and got.key_limit == Limit(None, 1)
    store.limit_set(LimitChange("api", None, per_key=True), T0)
    assert store.limit_get("api") is None


def test_a_raised_limit_counts_from_the_next_claim(store: Store) -> None:
    enqueue(store, 10)
    set_limit(store, concurrency=1)
    assert len(claim(store, 0.0)) == 1
    assert claim(store, 0.1) == []
    set_limit(store, concurrency=4)
    assert len(claim(store, 0.2)) == 3
    store.limit_set(LimitChange("api", None), T0)
    assert len(claim(store, 0.3)) == 6


def test_a_limit_set_by_another_process_holds_from_the_next_claim(dsn: str) -> None:
    worker, operator = open_store(dsn), open_store(dsn)
    try:
        worker.migrate()
        enqueue(worker, 10)
        assert len(worker.job_claim(["api"], 1, "w1", LEASE)) == 1  # no limit yet
        operator.limit_set(LimitChange("api", Limit(concurrency=2)), T0)
        # A store that has not seen the limit yet may pass the queue by, never past it...
        first = worker.job_claim(["api"], 10, "w1", LEASE)
        assert len(first) <= 1
        # ...and asks next_run_in after such a claim, which tells it: room now.
        if not first:
            assert worker.next_run_in(["api"]) == 0
        assert len(worker.job_claim(["api"], 10, "w1", LEASE)) == 1 - len(first)
        assert worker.job_claim(["api"], 10, "w1", LEASE) == []
        operator.limit_set(LimitChange("api", None), T0)
        assert len(worker.job_claim(["api"], 10, "w1", LEASE)) == 8
    finally:
        worker.close()
        operator.close()


# --- what operators see ------------------------------------------------------------------


def test_the_status_of_a_limit_says_how_full_it_is_and_what_it_holds_back(store: Store) -> None:
    enqueue(store, 10)
    enqueue(store, 3, queue="keyed", limit_key="a")
    enqueue(store, 1, queue="keyed", limit_key="b")
    set_limit(store, rate="4/s", concurrency=3)
    set_limit(store, "keyed", concurrency=1, per_key=True)
    claim(store, 0.0, limit=2)
    claim(store, 0.0, limit=10, queues=("keyed",))
    status = {s.queue: s for s in store.limit_status(at(0.5))}
    api = status["api"]
    assert (api.running, api.started, api.ready, api.room) == (2, 2, 8, 1)
    assert api.held_back == 7
    keyed = status["keyed"]
    assert (keyed.running, keyed.ready, keyed.keys_full, keyed.held_back) == (2, 2, 1, 2)
    stats = store.stats(at(0.5))
    assert set(stats.limits) == {"api", "keyed"}
    assert stats.limits["api"].held_back == 7


def test_maintenance_forgets_what_no_window_needs(store: Store) -> None:
    enqueue(store, 2)
    set_limit(store, rate="1/s")
    claim(store, 0.0)
    store.limit_throttle("other", "k", 5, at(0))
    store.limit_prune(at(600))
    assert store.limit_get("other") is None  # its only throttle ended
    status = {s.queue: s for s in store.limit_status(at(600))}
    assert status["api"].started == 0
    assert len(claim(store, 600)) == 1


# --- the App -------------------------------------------------------------------------------


def test_app_limit_takes_text_rates_and_refuses_bad_limits(app: App) -> None:
    limits = app.limit("mail", rate="600/m", concurrency=5)
    assert limits is not None and limits.limit == Limit(Rate(600, 60.0), 5)
    assert app.limit("mail", clear=True) is None
    with pytest.raises(ConfigurationError, match="give rate="):
        app.limit("mail")
    with pytest.raises(ConfigurationError, match="concurrency must be from 1 to 2,147,483,647"):
        app.limit("mail", concurrency=0)
    with pytest.raises(ConfigurationError, match="cannot read rate"):
        app.limit("mail", rate="fast")
    with pytest.raises(InvalidJobError):
        app.limit("", rate="1/s")
    assert app.limits() == {}


def test_limit_key_is_an_enqueue_option(app: App) -> None:
    @app.task(queue="api")
    def call(n: int) -> int:
        return n

    job = call.options(limit_key="customer-42").enqueue(1)
    assert app.get(job.id).limit_key == "customer-42"
    assert app.enqueue("call", [2], limit_key="c-7").limit_key == "c-7"
    with pytest.raises(InvalidJobError, match="limit_key"):
        call.options(limit_key="").enqueue(3)


def test_app_throttle_checks_its_length(app: App) -> None:
    until = app.throttle("api", 2)
    assert until > datetime.now(UTC)
    with pytest.raises(ConfigurationError, match="throttle"):
        app.throttle("api", -1)
    with pytest.raises(ConfigurationError, match="throttle"):
        app.throttle("api", float("inf"))
    app.throttle("api", 0)
    assert app.limits() == {}
