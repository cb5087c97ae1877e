"""Concurrent enqueues of keys that finished jobs hold ("forever", a Unique window)
while a worker claims and finishes each job as soon as it appears: exactly one
job per key on every store.

The race this guards: a producer looks the key up and finds nothing, another
producer's job of the key is inserted, claimed and finished, then the first
producer inserts. The live-key index no longer sees the finished job; the
store must decide the key under one lock (PostgreSQL), its one writer (SQLite)
or one script (Redis).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta

import psycopg

from conveyor import App
from conveyor.store.records import Finish

KEYS = 150
PROCESSES = 4

RACER = """
import json, sys, time
from conveyor import App
from conveyor.unique import Unique
dsn, start, keys = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with App(dsn) as app:
    app.store.job_get(1)  # connected before the start
    time.sleep(max(0.0, start - time.time()))
    ids = []
    for n in range(keys):
        unique = "forever" if n % 2 else Unique(period=3600, states=["succeeded"])
        ids.append(app.enqueue("t", queue="q", key=f"k{n}", unique=unique).id)
print(json.dumps(ids))
"""


def finish_everything(app: App, stop: threading.Event, done: list[int]) -> None:
    """A worker that completes each job of q as soon as it can claim it."""
    while not stop.is_set():
        jobs = app.store.job_claim(["q"], 50, "racer", timedelta(seconds=30))
        if jobs:
            finishes = [Finish.complete(j.id, j.lease_token or "", None) for j in jobs]
            done += app.store.job_finish(finishes)


def test_enqueues_racing_a_worker_that_finishes_the_keys_jobs_give_one_job_a_key(
    app: App, dsn: str
) -> None:
    start = time.time() + 3.0  # the processes start together, once all have connected
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, dsn, str(start), str(KEYS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    stop, done = threading.Event(), []
    worker = threading.Thread(target=finish_everything, args=(app, stop, done))
    worker.start()
    answers: list[list[int]] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            answers.append(json.loads(out))
    finally:
        stop.set()
        worker.join(timeout=30)
    jobs = app.jobs(queue="q", limit=10 * KEYS)
    per_key = Counter(j.key for j in jobs)
    assert len(jobs) == KEYS and set(per_key.values()) == {1}, per_key.most_common(3)
    # Every process was answered with the one job of each key.
    by_key = {j.key: j.id for j in jobs}
    for ids in answers:
        assert ids == [by_key[f"k{n}"] for n in range(KEYS)]
    assert len(done) >= 1  # the worker did finish jobs while the enqueues ran


def test_postgres_a_key_finished_while_another_enqueue_waits_still_answers_it(
    pg_clean_dsn: str,
) -> None:
    """The race made certain: a producer's job of the key is written, and ends, in a
    transaction that commits while another enqueue of the key is under way. The
    ending is written by hand in that transaction, standing for a worker's claim
    and finish landing between the other enqueue's lookup and its insert."""
    with App(pg_clean_dsn) as app, psycopg.connect(pg_clean_dsn) as first:
        app.migrate()
        job = app.enqueue("t", queue="q", key="k", unique="forever", connection=first)
        first.execute(
            "UPDATE jobs SET state = 'succeeded', finished_at = now() WHERE id = %s", [job.id]
        )
        answered: list[int] = []
        other = threading.Thread(
            target=lambda: answered.append(
                app.enqueue("t", queue="q", key="k", unique="forever").id
            )
        )
        other.start()
        time.sleep(0.5)  # the other enqueue is waiting: on the key's lock
        assert answered == []
        first.commit()
        other.join(timeout=30)
        assert answered == [job.id]
        assert [j.id for j in app.jobs(key="k")] == [job.id]
