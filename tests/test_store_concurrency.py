"""Many claimers on one database at once, on both backends.

Every test here opens one store per thread (or per process) from the same DSN,
as independent workers would, and checks the guarantees of the state machine
that only show under contention: a job is handed out once, a group runs one job
at a time and in order, a key names one live job, and a late completion and a
rescue never both win.
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import random
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor.job import Job, JobState, NewJob, utcnow
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from outcomes import listed

THREADS = 8
LEASE = timedelta(minutes=5)
#: How long any one test may wait for its threads or processes.
DEADLINE_SECONDS = 60.0


def _new_job(
    queue: str,
    *,
    key: str | None = None,
    group: str | None = None,
    run_at: datetime | None = None,
    max_attempts: int = 3,
) -> NewJob:
    return NewJob(
        queue=queue,
        task="work",
        args_json="[]",
        kwargs_json="{}",
        run_at=run_at if run_at is not None else utcnow(),
        max_attempts=max_attempts,
        key=key,
        group=group,
    )


def _seed(dsn: str, jobs: Sequence[NewJob]) -> list[int]:
    """Migrate the database and insert the jobs; return their ids."""
    store = open_store(dsn)
    try:
        store.migrate()
        return [job.id for job in store.job_insert_many(jobs, utcnow())]
    finally:
        store.close()


def _all_events(store: Store) -> list[Any]:
    events: list[Any] = []
    seq = 0
    while True:
        page = store.event_since(seq, 5000)
        if not page:
            return events
        events.extend(page)
        seq = page[-1].seq


def _all_jobs(store: Store) -> list[Job]:
    jobs: list[Job] = []
    before: int | None = None
    while True:
        page = listed(store, before_id=before, limit=1000)
        if not page:
            return jobs
        jobs.extend(page)
        before = page[-1].id


def _check_each_ran_once(dsn: str, ids: Sequence[int], claimed: Sequence[int]) -> None:
    """Every job was claimed once, succeeded once, and nothing is left queued or running."""
    duplicates = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert not duplicates, f"jobs claimed more than once: {duplicates[:20]}"
    assert sorted(claimed) == sorted(ids)
    store = open_store(dsn)
    try:
        jobs = _all_jobs(store)
        events = _all_events(store)
    finally:
        store.close()
    assert len(jobs) == len(ids)
    states = Counter(job.state for job in jobs)
    assert states == {JobState.SUCCEEDED: len(ids)}, states
    assert all(job.attempts == 1 for job in jobs)
    kinds: dict[int, Counter[str]] = defaultdict(Counter)
    for event in events:
        if event.kind != "enqueued":
            kinds[event.job_id][event.kind] += 1
    # The stored log: the claim's start is on the event that ends the attempt. The
    # enqueues are left out: PostgreSQL writes one event per enqueue statement (queue
    # and task), counting its jobs; each job's own is on its row.
    expected = Counter({"succeeded": 1})
    wrong = {job_id: dict(kinds[job_id]) for job_id in ids if kinds[job_id] != expected}
    assert not wrong, f"jobs whose history is not succeeded once: {wrong}"


def _claim_until_empty(store: Store, queue: str, limit: int, worker: str) -> list[int]:
    """Claim and complete until a claim comes back empty (nothing is ever requeued here)."""
    claimed: list[int] = []
    while True:
        jobs = store.job_claim([queue], limit, worker, LEASE, utcnow())
        if not jobs:
            return claimed
        claimed.extend(job.id for job in jobs)
        assert all(job.lease_token for job in jobs)
        done = store.job_finish(
            [Finish.complete(job.id, job.lease_token or "", "null") for job in jobs], utcnow()
        )
        assert sorted(done) == sorted(job.id for job in jobs), "a fresh lease did not hold"


def _run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` on ``count`` threads started together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=DEADLINE_SECONDS)
            results[index] = target(index)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_SECONDS)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish in time"
    if errors:
        # A thread that failed breaks the barriers the others wait at: report its error.
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    return results


# --- one job, one claim --------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [1, 5])
def test_threads_claim_each_job_once(dsn: str, limit: int) -> None:
    ids = _seed(dsn, [_new_job("q") for _ in range(1500)])

    def claimer(index: int) -> list[int]:
        store = open_store(dsn)
        try:
            return _claim_until_empty(store, "q", limit, f"thread-{index}")
        finally:
            store.close()

    per_thread = _run_threads(THREADS, claimer)
    _check_each_ran_once(dsn, ids, [job_id for got in per_thread for job_id in got])


def _claim_in_process(
    dsn: str, limit: int, worker: str, barrier: Any, results: Any
) -> None:  # pragma: no cover - runs in a child process
    """Child process: open a store of its own, wait for the others, claim until empty."""
    try:
        store = open_store(dsn)
        try:
            barrier.wait(timeout=DEADLINE_SECONDS)
            results.put((worker, "ok", _claim_until_empty(store, "q", limit, worker)))
        finally:
            store.close()
    except BaseException:
        barrier.abort()  # the others stop waiting for this one
        results.put((worker, "error", traceback.format_exc()))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("limit", [1, 5])
def test_processes_claim_each_job_once(dsn: str, limit: int) -> None:
    ids = _seed(dsn, [_new_job("q") for _ in range(1500)])
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(THREADS)
    results = context.Queue()
    processes = [
        context.Process(
            target=_claim_in_process, args=(dsn, limit, f"process-{i}", barrier, results)
        )
        for i in range(THREADS)
    ]
    for process in processes:
        process.start()
    answers = []
    try:
        for _ in processes:
            answers.append(results.get(timeout=DEADLINE_SECONDS))
    except queue_module.Empty:
        pytest.fail(f"only {len(answers)} of {THREADS} processes answered in time")
    finally:
        for process in processes:
            process.join(DEADLINE_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
        results.close()
        results.join_thread()
    errors = [detail for _, status, detail in answers if status == "error"]
    assert not errors, errors[0]
    assert all(process.exitcode == 0 for process in processes)
    # Not one process draining the queue alone while the others started up.
    assert sum(1 for _, _, got in answers if got) >= 2
    _check_each_ran_once(dsn, ids, [job_id for _, _, got in answers for job_id in got])


# --- groups ----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_groups_run_one_at_a_time_in_order(dsn: str) -> None:
    groups = [f"g{i}" for i in range(40)]
    new_jobs = [_new_job("q", group=group) for _ in range(25) for group in groups]
    new_jobs += [_new_job("q") for _ in range(100)]
    random.Random(7).shuffle(new_jobs)
    ids = _seed(dsn, new_jobs)
    group_of = {job_id: new.group for job_id, new in zip(ids, new_jobs, strict=True)}
    total = len(ids)

    lock = threading.Lock()
    in_hand: set[str] = set()
    order: dict[str, list[int]] = defaultdict(list)
    claimed: list[int] = []
    conflicts: list[str] = []
    finished = [0]

    def claimer(index: int) -> None:
        rng = random.Random(index)
        store = open_store(dsn)
        deadline = time.monotonic() + DEADLINE_SECONDS
        try:
            while True:
                with lock:
                    if finished[0] == total:
                        return
                assert time.monotonic() < deadline, "the queue did not drain in time"
                jobs = store.job_claim(["q"], 4, f"thread-{index}", LEASE, utcnow())
                if not jobs:
                    # Groups whose job is in another thread's hand are not ready: wait.
                    time.sleep(0.001)
                    continue
                with lock:
                    for job in jobs:
                        claimed.append(job.id)
                        assert job.group == group_of[job.id]
                        if job.group is None:
                            continue
                        if job.group in in_hand:
                            conflicts.append(f"{job.group}: job {job.id} claimed while running")
                        in_hand.add(job.group)
                        order[job.group].append(job.id)
                for job in jobs:
                    time.sleep(rng.uniform(0, 0.002))
                    # Unmark before completing, not after: once complete commits, another
                    # thread may claim the group's next job at once, before this thread
                    # could unmark, which would be a false alarm. The check stays sound:
                    # the database must not hand out the group's next job before this
                    # complete commits, and that happens after the unmark; a job handed
                    # out earlier than that is caught while this one is still marked.
                    if job.group is not None:
                        with lock:
                            in_hand.discard(job.group)
                    done = store.job_finish(
                        [Finish.complete(job.id, job.lease_token or "", "null")], utcnow()
                    )
                    assert done == [job.id]
                    with lock:
                        finished[0] += 1
        finally:
            store.close()

    _run_threads(THREADS, claimer)
    assert not conflicts, conflicts[:10]
    for group in groups:
        expected = [job_id for job_id in ids if group_of[job_id] == group]
        assert order[group] == expected, f"group {group} ran out of enqueue order"
    _check_each_ran_once(dsn, ids, claimed)


# --- keys --------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("batch", [False, True], ids=["one-by-one", "one-batch"])
def test_same_keys_from_many_threads_make_one_job_each(dsn: str, batch: bool) -> None:
    _seed(dsn, [])
    keys = [f"k{i}" for i in range(50)]
    # Each round in a queue of its own: a race that is lost once in a while still shows.
    rounds = 40 if batch else 8

    def producer(index: int) -> dict[str, dict[str, int]]:
        store = open_store(dsn)
        answers: dict[str, dict[str, int]] = {}
        rng = random.Random(index)
        try:
            for round_ in range(rounds):
                queue = f"q{round_}"
                mine = list(keys)
                rng.shuffle(mine)
                barrier.wait(timeout=DEADLINE_SECONDS)
                if batch:
                    jobs = store.job_insert_many([_new_job(queue, key=k) for k in mine], utcnow())
                else:
                    jobs = [
                        store.job_insert_many([_new_job(queue, key=k)], utcnow())[0] for k in mine
                    ]
                assert [(job.queue, job.key) for job in jobs] == [(queue, k) for k in mine]
                answers[queue] = {job.key or "": job.id for job in jobs}
        except BaseException:
            barrier.abort()  # the other threads stop at the next round instead of hanging
            raise
        finally:
            store.close()
        return answers

    barrier = threading.Barrier(THREADS)
    answers = _run_threads(THREADS, producer)
    store = open_store(dsn)
    try:
        jobs = _all_jobs(store)
        events = _all_events(store)
    finally:
        store.close()
    assert len(jobs) == rounds * len(keys)
    for round_ in range(rounds):
        queue = f"q{round_}"
        by_key = {job.key: job.id for job in jobs if job.queue == queue}
        assert sorted(by_key) == sorted(keys)
        for answer in answers:
            assert answer[queue] == by_key, "a thread was handed another job for the same key"
    # Only enqueues, each naming a job made (PostgreSQL writes one per statement, named
    # after its first job and counting them; SQLite and Redis one a job).
    assert {event.kind for event in events} == {"enqueued"}
    assert {event.job_id for event in events} <= {job.id for job in jobs}
    assert len(events) <= rounds * len(keys)


# --- rescue against a late completion ------------------------------------------------


@pytest.mark.timeout(60)
def test_rescue_and_late_complete_never_both_win(dsn: str) -> None:
    rounds = 200
    start = datetime(2030, 1, 1, tzinfo=UTC)
    step = timedelta(seconds=10)
    short_lease = timedelta(seconds=1)
    # Job i lives in a queue of its own, is claimed at start + i*step, and its lease has
    # expired at start + i*step + 2s: round i's rescue finds it and no later job.
    ids = _seed(
        dsn,
        [_new_job(f"race-{i}", run_at=start, max_attempts=3) for i in range(rounds)],
    )
    store = open_store(dsn)
    try:
        tokens = []
        for i, job_id in enumerate(ids):
            (job,) = store.job_claim([f"race-{i}"], 1, "doomed", short_lease, start + i * step)
            assert job.id == job_id
            tokens.append(job.lease_token or "")
    finally:
        store.close()

    barrier = threading.Barrier(2)
    rescued: list[list[int]] = [[] for _ in range(rounds)]
    completed: list[list[int]] = [[] for _ in range(rounds)]

    def racer(index: int) -> None:
        store = open_store(dsn)
        try:
            for i in range(rounds):
                now = start + i * step + timedelta(seconds=2)
                barrier.wait(timeout=DEADLINE_SECONDS)
                if index == 0:
                    rescued[i] = store.job_rescue_expired(now)
                else:
                    completed[i] = store.job_finish(
                        [Finish.complete(ids[i], tokens[i], '"late"')], now
                    )
        except BaseException:
            barrier.abort()
            raise
        finally:
            store.close()

    _run_threads(2, racer)

    store = open_store(dsn)
    try:
        jobs = {job.id: job for job in store.job_get_many(ids)}
        events = _all_events(store)
    finally:
        store.close()
    kinds: dict[int, Counter[str]] = defaultdict(Counter)
    for event in events:
        kinds[event.job_id][event.kind] += 1
    wins = Counter()
    for i, job_id in enumerate(ids):
        job = jobs[job_id]
        assert set(rescued[i]) <= {job_id}, f"round {i} rescued other jobs: {rescued[i]}"
        rescue_won = rescued[i] == [job_id]
        complete_won = completed[i] == [job_id]
        assert rescue_won != complete_won, (
            f"round {i}: rescue returned {rescued[i]}, complete returned {completed[i]}"
        )
        if complete_won:
            wins["complete"] += 1
            assert job.state == JobState.SUCCEEDED
            assert job.result_json is not None
            assert kinds[job_id] == {"enqueued": 1, "succeeded": 1}
        else:
            wins["rescue"] += 1
            assert job.state == JobState.QUEUED
            assert job.lease_token is None
            assert job.error == "worker lost: lease expired"
            assert kinds[job_id] == {"enqueued": 1, "rescued": 1}
    assert sum(wins.values()) == rounds
