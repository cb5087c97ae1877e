"""Replace and debounce, on every store: ``on_conflict="replace"`` updates the queued
job holding a key in place; a running job is never changed and gives its key to a
new job; ``debounce=`` makes a burst of enqueues one job, run after the window
with the last arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from conveyor import App, InvalidJobError
from conveyor.job import JobState, utcnow
from conveyor.store.records import Finish
from conveyor.testing import drain

LEASE = timedelta(seconds=30)


def test_replace_updates_the_queued_job_in_place(app: App) -> None:
    @app.task(queue="q")
    def sync(n: int) -> None: ...

    first = sync.options(key="k", delay=60).enqueue(1)
    again = sync.options(key="k", on_conflict="replace", priority=5, delay=120).enqueue(2)
    assert again.id == first.id and again.existing
    stored = app.get(first.id)
    assert stored.args == [2] and stored.priority == 5 and stored.state is JobState.QUEUED
    assert stored.run_at > first.run_at + timedelta(seconds=50)
    assert [e.kind for e in app.events(first.id)] == ["enqueued", "replaced"]
    assert len(app.jobs(key="k")) == 1


def test_a_running_job_is_never_changed_and_gives_its_key_to_a_new_job(app: App) -> None:
    @app.task(queue="q")
    def sync(n: int) -> None: ...

    first = sync.options(key="k").enqueue(1)
    (running,) = app.store.job_claim(["q"], 1, "w", LEASE)
    second = sync.options(key="k", on_conflict="replace").enqueue(2)
    assert second.id != first.id and not second.existing
    held = app.get(first.id)
    assert held.state is JobState.RUNNING and held.args == [1] and held.key is None
    assert app.get(second.id).key == "k" and app.get(second.id).args == [2]
    # The running job still ends under its lease.
    app.store.job_finish([Finish.complete(running.id, running.lease_token or "", None)])
    assert app.get(first.id).state is JobState.SUCCEEDED
    third = sync.options(key="k", on_conflict="replace").enqueue(3)
    assert third.id == second.id and app.get(second.id).args == [3]


def test_debounce_makes_a_burst_one_job_with_the_last_arguments(app: App) -> None:
    ran: list[int] = []

    @app.task(queue="q")
    def save(n: int) -> None:
        ran.append(n)

    before = utcnow()
    jobs = [save.options(key="doc-1", debounce=0.3).enqueue(n) for n in range(5)]
    assert len({j.id for j in jobs}) == 1
    job = app.get(jobs[0].id)
    assert job.args == [4] and job.run_at >= before + timedelta(seconds=0.3)
    drain(app, queues=["q"])
    assert ran == []  # not before the window has passed
    time.sleep(0.4)
    drain(app, queues=["q"])
    assert ran == [4]
    # After the run, the key is free: the next burst is a new job.
    later = save.options(key="doc-1", debounce=0.3).enqueue(9)
    assert later.id != jobs[0].id


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"on_conflict": "replace"}, "needs a key"),
        ({"on_conflict": "merge", "key": "k"}, "on_conflict must be"),
        ({"debounce": 5}, "needs a key"),
        ({"debounce": 0, "key": "k"}, "positive"),
        ({"debounce": 5, "key": "k", "delay": 1}, "no delay or run_at"),
    ],
)
def test_bad_options_are_refused(app: App, options: dict[str, object], words: str) -> None:
    @app.task(queue="q")
    def job() -> None: ...

    with pytest.raises(InvalidJobError, match=words):
        job.options(**options).enqueue()
    assert app.store.job_get(1) is None


DEBOUNCER = """
import json, sys
from conveyor import App
with App(sys.argv[1]) as app:
    ids = [app.enqueue("t", [n], queue="q", key="k", debounce=60).id for n in range(15)]
print(json.dumps(ids))
"""


def test_concurrent_debounced_enqueues_give_one_job(app: App, dsn: str) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", DEBOUNCER, dsn], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    ids: set[int] = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        ids.update(json.loads(out))
    assert len(ids) == 1 and len(app.jobs(key="k")) == 1
    (job_id,) = ids
    assert app.get(job_id).args == [14]  # the last enqueue of one of them
    assert len([e for e in app.events(job_id) if e.kind == "replaced"]) == 59


def test_a_held_job_stays_held_when_replaced(app: App) -> None:
    @app.task(queue="q")
    def sync(n: int) -> None: ...

    first = sync.options(key="k").enqueue(1)
    assert app.hold(first.id).held
    again = sync.options(key="k", on_conflict="replace", delay=3600).enqueue(2)
    assert again.id == first.id
    held = app.get(first.id)
    assert held.held and held.args == [2]
    let_go = app.unhold(first.id)
    assert not let_go.held and let_go.run_at > utcnow() + timedelta(minutes=59)
