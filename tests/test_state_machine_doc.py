"""The state machine's table in docs/architecture.md, driven row by row on every store.

The table is the documentation; this test reads it and performs each row's
action on a real store, from a job put in the row's "from" state, and checks
the "to" state. A row whose action this test does not know fails, and so
does an action known here that the table leaves out: prose and stores
cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import signal_actions
from conveyor.job import Job, JobState, NewJob
from conveyor.store.protocols import HoldStore, Store
from conveyor.store.records import Finish
from outcomes import cancel_one, retry_one

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
NOW = datetime(2031, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def table() -> list[tuple[str, str, str]]:
    text = DOC.read_text()
    block = text.split("<!-- state-machine: begin -->")[1].split("<!-- state-machine: end -->")[0]
    rows = []
    for line in block.strip().splitlines()[2:]:  # after the header and its rule
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], cells[1], cells[2]))
    return rows


class Bench:
    """One store, a fresh queue per row, and the steps that put a job in a state."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.row = 0

    def enqueue(self, max_attempts: int = 3) -> Job:
        self.row += 1
        queue = f"row{self.row}"
        new = NewJob(queue, "t", "[]", "{}", NOW, max_attempts=max_attempts)
        (job,) = self.store.job_insert_many([new], NOW)
        return job

    def claim(self, job: Job) -> Job:
        (claimed,) = self.store.job_claim([job.queue], 1, "w", LEASE, now=NOW)
        assert claimed.id == job.id
        return claimed

    def state(self, job: Job) -> JobState:
        (now,) = self.store.job_get_many([job.id])
        return now.state


def finish(kind: str, *, last: bool = False, cancel: bool = False) -> Callable[[Bench], Job]:
    def run(bench: Bench) -> Job:
        job = bench.claim(bench.enqueue(max_attempts=1 if last else 3))
        assert job.lease_token is not None
        if cancel:
            cancel_one(bench.store, job.id, NOW)
        outcome = {
            "complete": Finish.complete(job.id, job.lease_token, "null"),
            "retry": Finish.retry(job.id, job.lease_token, "boom", NOW),
            "fail": Finish.fail(job.id, job.lease_token, "boom"),
            "snooze": Finish.snooze(job.id, job.lease_token, NOW),
            "release": Finish.release(job.id, job.lease_token),
            "cancelled": Finish.cancelled(job.id, job.lease_token),
        }[kind]
        assert bench.store.job_finish([outcome], NOW) == [job.id]
        return job

    return run


def rescue(last: bool) -> Callable[[Bench], Job]:
    def run(bench: Bench) -> Job:
        job = bench.claim(bench.enqueue(max_attempts=1 if last else 3))
        assert job.id in bench.store.job_rescue_expired(NOW + 2 * LEASE)
        return job

    return run


def take_back(bench: Bench) -> Job:
    job = bench.claim(bench.enqueue())
    assert bench.store.job_take_back([job.id], NOW) == [job.id]
    return job


def claim(bench: Bench) -> Job:
    return bench.claim(bench.enqueue())


def cancel_queued(bench: Bench) -> Job:
    job = bench.enqueue()
    cancel_one(bench.store, job.id, NOW)
    return job


def cancel_running(bench: Bench) -> Job:
    job = bench.claim(bench.enqueue())
    cancel_one(bench.store, job.id, NOW)
    (after,) = bench.store.job_get_many([job.id])
    assert after.cancel_requested
    return job


def retry_failed(bench: Bench) -> Job:
    job = finish("fail")(bench)
    retry_one(bench.store, job.id, NOW)
    return job


def retry_cancelled(bench: Bench) -> Job:
    job = cancel_queued(bench)
    retry_one(bench.store, job.id, NOW)
    return job


def waiting_child(bench: Bench, on_failure: str = "cancel") -> tuple[Job, Job]:
    """A claimed parent, and a child waiting for it (enqueued with ``after``)."""
    parent = bench.claim(bench.enqueue())
    new = NewJob(parent.queue, "t", "[]", "{}", NOW, after=(parent.id,), after_failure=on_failure)  # type: ignore[arg-type]
    (child,) = bench.store.job_insert_many([new], NOW)
    assert child.state == JobState.WAITING
    return parent, child


def parent_ends(kind: str, on_failure: str = "cancel") -> Callable[[Bench], Job]:
    def run(bench: Bench) -> Job:
        parent, child = waiting_child(bench, on_failure)
        assert parent.lease_token is not None
        outcome = {
            "complete": Finish.complete(parent.id, parent.lease_token, "null"),
            "fail": Finish.fail(parent.id, parent.lease_token, "boom"),
            "cancelled": Finish.cancelled(parent.id, parent.lease_token),
        }[kind]
        assert bench.store.job_finish([outcome], NOW) == [parent.id]
        return child

    return run


def cancel_waiting(bench: Bench) -> Job:
    _, child = waiting_child(bench)
    cancel_one(bench.store, child.id, NOW)
    return child


def hold_queued(bench: Bench) -> Job:
    job = bench.enqueue()
    assert cast(HoldStore, bench.store).job_hold([job.id], NOW) == [job.id]
    (held,) = bench.store.job_get_many([job.id])
    assert held.held and bench.store.job_claim([job.queue], 1, "w", LEASE, now=NOW) == []
    return job


def hold_running(bench: Bench) -> Job:
    job = bench.claim(bench.enqueue())
    assert cast(HoldStore, bench.store).job_hold([job.id], NOW) == []
    (after,) = bench.store.job_get_many([job.id])
    assert after.lease_token == job.lease_token and not after.held
    return job


def unhold(bench: Bench) -> Job:
    job = hold_queued(bench)
    assert cast(HoldStore, bench.store).job_unhold([job.id], NOW) == [job.id]
    claimed = bench.claim(job)  # claimable again; handed back to end where the row says
    bench.store.job_finish([Finish.release(job.id, claimed.lease_token or "")], NOW)
    return job


#: (from, action) -> what performs it, returning the job it acted on.
ACTIONS: dict[tuple[str, str], Callable[[Bench], Job]] = {
    ("queued", "claim"): claim,
    ("running", "finish complete"): finish("complete"),
    ("running", "finish retry, attempts left"): finish("retry"),
    ("running", "finish retry, last attempt"): finish("retry", last=True),
    ("running", "finish fail"): finish("fail"),
    ("running", "finish snooze"): finish("snooze"),
    ("running", "finish release"): finish("release"),
    ("running", "finish cancelled"): finish("cancelled"),
    ("running", "finish complete, cancel requested"): finish("complete", cancel=True),
    ("running", "finish retry, cancel requested"): finish("retry", cancel=True),
    ("running", "finish release, cancel requested"): finish("release", cancel=True),
    ("running", "rescue, attempts left"): rescue(last=False),
    ("running", "rescue, last attempt"): rescue(last=True),
    ("running", "take back, attempts left"): take_back,
    ("queued", "cancel"): cancel_queued,
    ("running", "cancel"): cancel_running,
    ("failed", "retry"): retry_failed,
    ("cancelled", "retry"): retry_cancelled,
    ("waiting", "last parent succeeds"): parent_ends("complete"),
    ("waiting", "a parent fails"): parent_ends("fail"),
    ("waiting", "a parent fails, runs anyway, last parent"): parent_ends("fail", "run"),
    ("waiting", "a parent is cancelled"): parent_ends("cancelled"),
    ("waiting", "cancel"): cancel_waiting,
    ("queued", "hold"): hold_queued,
    ("running", "hold"): hold_running,
    ("queued", "unhold"): unhold,
    **signal_actions.ACTIONS,
}


def test_the_table_and_the_checked_actions_are_the_same() -> None:
    documented = {(start, action) for start, action, _ in table()}
    assert documented == set(ACTIONS), documented ^ set(ACTIONS)


def test_every_row_of_the_table_holds_on_the_store(store: Store) -> None:
    bench = Bench(store)
    wrong = []
    for start, action, end in table():
        job = ACTIONS[(start, action)](bench)
        got = bench.state(job)
        if got != JobState(end):
            wrong.append(f"{start} --{action}--> {got}, the table says {end}")
    assert wrong == []


def test_the_table_names_only_real_states() -> None:
    for start, _, end in table():
        JobState(start), JobState(end)  # raises on a name that is not a state
        assert re.fullmatch(r"[a-z]+", start) and re.fullmatch(r"[a-z]+", end)
