"""Unique windows and states: ``unique=Unique(period=..., states=[...])`` beside
"live" and "forever", on every store; concurrent enqueues of one key from several
processes give exactly one job."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from conveyor import App, InvalidJobError
from conveyor.job import JobState, NewJob
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from conveyor.unique import Unique, resolve_unique

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
HOUR = timedelta(hours=1)


def keyed(now: datetime, unique: object = "live") -> NewJob:
    mode, states, since = resolve_unique(now, unique)
    return NewJob(
        "q", "t", "[]", "{}", run_at=now, key="k", unique=mode,  # type: ignore[arg-type]
        unique_states=states, unique_since=since,
    )  # fmt: skip


def finish(store: Store, kind: str, at: datetime) -> int:
    (job,) = store.job_claim(["q"], 1, "w", LEASE, at)
    token = job.lease_token or ""
    outcome = {
        "complete": Finish.complete(job.id, token, None),
        "fail": Finish.fail(job.id, token, "boom"),
        "cancelled": Finish.cancelled(job.id, token),
    }[kind]
    assert store.job_finish([outcome], at) == [job.id]
    return job.id


def test_a_finished_job_holds_its_key_for_the_period(store: Store) -> None:
    (first,) = store.job_insert_many([keyed(NOW, Unique(period=HOUR))], NOW)
    finish(store, "complete", NOW)
    soon = NOW + timedelta(minutes=59)
    (again,) = store.job_insert_many([keyed(soon, Unique(period=HOUR))], soon)
    assert again.id == first.id and again.state is JobState.SUCCEEDED
    later = NOW + timedelta(minutes=61)
    (fresh,) = store.job_insert_many([keyed(later, Unique(period=HOUR))], later)
    assert fresh.id != first.id and fresh.state is JobState.QUEUED


def test_states_choose_which_finished_jobs_hold_the_key(store: Store) -> None:
    (first,) = store.job_insert_many([keyed(NOW)], NOW)
    finish(store, "cancelled", NOW)
    # Default states (succeeded, failed): a cancelled job lets its key go.
    (other,) = store.job_insert_many([keyed(NOW, Unique(period=HOUR))], NOW)
    assert other.id != first.id
    finish(store, "fail", NOW)
    (held,) = store.job_insert_many([keyed(NOW, Unique(states=["failed"]))], NOW)
    assert held.id == other.id and held.state is JobState.FAILED
    # Only cancelled ones: the newest cancelled job answers, not the failed one.
    (cancelled,) = store.job_insert_many([keyed(NOW, Unique(states=["cancelled"]))], NOW)
    assert cancelled.id == first.id


def test_a_live_job_always_holds_its_key(store: Store) -> None:
    (live,) = store.job_insert_many([keyed(NOW)], NOW)
    (again,) = store.job_insert_many([keyed(NOW, Unique(states=[]))], NOW)
    assert again.id == live.id
    (same,) = store.job_insert_many([keyed(NOW, Unique(period=1, states=["cancelled"]))], NOW)
    assert same.id == live.id


def test_the_enqueue_answers_with_the_job_it_matched(app: App) -> None:
    @app.task(queue="q")
    def report(day: str) -> None: ...

    first = report.options(key="daily", unique=Unique(period=HOUR)).enqueue("mon")
    (job,) = app.store.job_claim(["q"], 1, "w", LEASE)
    app.store.job_finish([Finish.complete(job.id, job.lease_token or "", None)])
    again = report.options(key="daily", unique=Unique(period=HOUR)).enqueue("tue")
    assert again.id == first.id and again.existing and again.args == ["mon"]
    by_name = app.enqueue("report", ["wed"], key="daily", unique=Unique(period=3600))
    assert by_name.id == first.id


@pytest.mark.parametrize(
    ("unique", "words"),
    [
        ("sometimes", "unique must be"),
        (Unique(period=-1), "positive"),
        (Unique(period=timedelta(0)), "positive"),
        (Unique(states=["done"]), "must be job states"),
        (Unique(states="failed"), "not one string"),
    ],
)
def test_bad_policies_are_refused(app: App, unique: object, words: str) -> None:
    @app.task(queue="q")
    def job() -> None: ...

    with pytest.raises(InvalidJobError, match=words):
        job.options(key="k", unique=unique).enqueue()
    assert app.store.job_get(1) is None


ENQUEUER = """
import json, sys
from conveyor import App
from conveyor.unique import Unique
with App(sys.argv[1]) as app:
    ids = [app.enqueue("t", queue="q", key="k", unique=Unique(period=3600)).id for _ in range(15)]
print(json.dumps(ids))
"""


def enqueue_from_processes(dsn: str, count: int = 4) -> set[int]:
    procs = [
        subprocess.Popen([sys.executable, "-c", ENQUEUER, dsn], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    ids: set[int] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        ids.update(json.loads(out))
    return ids


def test_concurrent_enqueues_of_one_key_give_one_job(app: App, dsn: str) -> None:
    ids = enqueue_from_processes(dsn)
    assert len(ids) == 1 and [j.id for j in app.jobs(key="k")] == list(ids)
    (job,) = app.store.job_claim(["q"], 1, "w", LEASE)
    app.store.job_finish([Finish.complete(job.id, job.lease_token or "", None)])
    # Finished within the period: it still answers every enqueue.
    assert enqueue_from_processes(dsn) == ids
    assert len(app.jobs(key="k")) == 1
