"""Redis repairs what it cannot read: a job whose hash is gone or incomplete.

A job's hash can vanish from under its index entries (a ``DEL`` by hand, an
eviction under an evicting memory policy), or lack a field every job has.
Whoever meets such an id in an index drops it: its index entries go, its
group's and limit's counts are freed, stats stop counting it, and the event
stream records a ``dropped`` event. These tests delete hashes on a real
redis-server and check every index against the jobs that are left.
"""

from __future__ import annotations

import dataclasses
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, JobState
from conveyor.cli import cli
from conveyor.errors import JobNotFoundError
from conveyor.job import Event, Job, NewJob, utcnow
from conveyor.limits import Limit
from conveyor.store.dsn import open_store
from conveyor.store.event_kinds import DROPPED_INCOMPLETE, DROPPED_MISSING
from conveyor.store.records import Finish, Lease, LimitChange
from conveyor.store.redis import RedisStore
from conveyor.store.redis import base as redis_base
from conveyor.store.redis import core as redis_core
from conveyor.web import create_app
from outcomes import listed, purge
from waiting import wait_until

pytestmark = pytest.mark.redis

P = "{conveyor}:"
LEASE = timedelta(seconds=30)
AFTER_THE_LEASE = LEASE + timedelta(seconds=1)


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


def new_job(queue: str = "q", task: str = "t", **fields: Any) -> NewJob:
    job = NewJob(queue=queue, task=task, args_json="[]", kwargs_json="{}", run_at=utcnow())
    return dataclasses.replace(job, **fields)


def nm(name: str) -> str:
    return f"{len(name.encode())}.{name}"


def claim(
    store: RedisStore, queue: str = "q", limit: int = 10, at: datetime | None = None
) -> list[Job]:
    return store.job_claim([queue], limit, "w", LEASE, now=at)


def complete(store: RedisStore, job: Job, at: datetime | None = None) -> list[int]:
    return store.job_finish([Finish.complete(job.id, job.lease_token or "", None)], now=at)


def dropped_events(store: RedisStore) -> list[Event]:
    return [e for e in store.event_since(0, 100_000) if e.kind == "dropped"]


def counts(store: RedisStore, queue: str = "q") -> dict[str, int]:
    stats = store.stats(utcnow()).queues.get(queue)
    return {} if stats is None else dict(stats.counts)


def index_problems(client: Any) -> list[str]:
    """Every way the indexes disagree with the job hashes that are there.

    Every id in an index is a job that can be read, in the index of its state;
    every count (jobs per queue, running per group and limit key, a batch's
    jobs per state, running jobs by lease) is what the hashes say.
    """
    jobs: dict[str, dict[str, str]] = {}
    for key in client.scan_iter(match=P + "job:*", count=1000):
        fields = client.hgetall(key)
        jobs[fields["id"]] = fields
    problems: list[str] = []
    id_sets = ("qs", "due", "wait", "retrying", "gq", "group", "batch", "key", "kq", "finished")
    for key in client.scan_iter(match=P + "*", count=1000):
        kind = key[len(P) :].split(":", 1)[0]
        if kind in id_sets:
            problems += [f"{key} holds {i}" for i in client.zrange(key, 0, -1) if i not in jobs]
        elif kind == "ready":
            ids = (str(int(m[11:])) for m in client.zrange(key, 0, -1))
            problems += [f"{key} holds {i}" for i in ids if i not in jobs]
    for i, job in jobs.items():
        if client.zscore(f"{P}qs:{nm(job['queue'])}:{job['state']}", i) is None:
            problems.append(f"job {i} is not in the index of its state")
    per_queue = Counter(job["queue"] for job in jobs.values())
    held = {q: int(n) for q, n in client.hgetall(P + "queues").items()}
    if held != dict(per_queue):
        problems.append(f"jobs per queue {held} != {dict(per_queue)}")
    running = [job for job in jobs.values() if job["state"] == "running"]
    for job in running:  # a running set is scored by lease expiry: the rescue's range
        score = client.zscore(f"{P}qs:{nm(job['queue'])}:running", job["id"])
        if score is None or abs(score - float(job["lease_expires_at"])) > 1e-3:
            problems.append(f"job {job['id']} is not in its running set by its lease")
    per_group = Counter(job["group_key"] for job in running if "group_key" in job)
    held = {g: int(n) for g, n in client.hgetall(P + "grun").items()}
    if held != dict(per_group):
        problems.append(f"running per group {held} != {dict(per_group)}")
    for q in per_queue:
        per_key = Counter(j["limit_key"] for j in running if j["queue"] == q and "limit_key" in j)
        held = {k: int(n) for k, n in client.hgetall(f"{P}krun:{nm(q)}").items()}
        if held != dict(per_key):
            problems.append(f"running per limit key of {q}: {held} != {dict(per_key)}")
    per_batch = Counter((job["batch"], job["state"]) for job in jobs.values() if "batch" in job)
    for key in client.scan_iter(match=P + "bcount:*"):
        batch = key[len(P + "bcount:") :]
        for state, n in client.hgetall(key).items():
            if int(n) != per_batch.get((batch, state), 0):
                problems.append(f"batch {batch} counts {n} {state}")
    for key in client.scan_iter(match=P + "gq:*"):
        head = client.zrange(key, 0, 0)[0]
        job = jobs.get(head)
        if job is not None and job["state"] == "queued":
            q = nm(job["queue"])
            waiting = client.zscore(f"{P}wait:{q}", head) is not None
            ready = any(
                m.endswith(f":{int(head):016d}") for m in client.zrange(f"{P}ready:{q}", 0, -1)
            )
            if not (waiting or ready):
                problems.append(f"the head {head} of {key} is not claimable")
    return problems


def sweep_everything(store: RedisStore, client: Any, at: datetime) -> None:
    """Rescue rounds until the sweep of dropped ids has walked every key."""
    for _ in range(1000):
        store.job_rescue_expired(at)
        if not client.exists(P + "lost", P + "lost:sweeping"):
            return
    raise AssertionError("the sweep never ended")


def test_every_script_that_can_meet_such_a_job_drops_it_or_hands_it_back() -> None:
    """Scripts with upkeep.lua drop what they cannot read; the others return it."""
    folder = resources.files("conveyor.store.redis").joinpath("scripts")
    reaching = re.compile(
        r"\b(leave|wake_group|wake_freed|find_key|finish_all|candidates|claim|promote|promote_head)\("
    )
    upkeep_only = re.compile(r"\b(delete|delete_events|requeue_manually|drop)\(")
    for entry in folder.iterdir():
        if entry.name in ("common.lua", "upkeep.lua", "flows.lua") or not entry.name.endswith(
            ".lua"
        ):
            continue
        text = entry.read_text()
        if "\n-- uses upkeep.lua\n" in text:
            continue
        assert not upkeep_only.search(text), entry.name
        if reaching.search(text):
            assert re.search(r"return done\(\{.*, unreadable[,}]", text), entry.name


# --- a running job whose hash is gone ------------------------------------------------------


def test_a_running_job_deleted_by_hand_frees_its_group_at_rescue(
    store: RedisStore, client: Any
) -> None:
    first, second = store.job_insert_many([new_job(group="chat"), new_job(group="chat")], utcnow())
    (running,) = claim(store)
    assert running.id == first.id
    assert claim(store) == []  # the group runs one job at a time
    client.delete(f"{P}job:{first.id}")

    assert store.job_rescue_expired(utcnow()) == []  # the lease still holds: nothing yet
    assert counts(store) == {"queued": 1, "running": 1}
    assert store.job_rescue_expired(utcnow() + AFTER_THE_LEASE) == []  # dropped, not rescued

    assert counts(store) == {"queued": 1}  # no phantom running job
    (event,) = dropped_events(store)
    assert (event.job_id, event.queue, event.error) == (first.id, "q", DROPPED_MISSING)
    (nxt,) = claim(store)
    assert nxt.id == second.id  # the group goes on
    assert index_problems(client) == []  # its group was found among those running a job
    assert len(dropped_events(store)) == 1


def test_a_running_job_whose_hash_lost_its_queue_is_not_renewed_and_is_dropped(
    store: RedisStore, client: Any
) -> None:
    (job,) = store.job_insert_many([new_job()], utcnow())
    (running,) = claim(store)
    client.hdel(f"{P}job:{job.id}", "queue")
    # Its heartbeat does not hold: the worker takes the lease as lost.
    assert store.job_heartbeat([Lease(job.id, running.lease_token or "")], LEASE) == []
    # Still in its queue's running set, by its lease: the rescue meets it there.
    assert store.job_rescue_expired(utcnow() + AFTER_THE_LEASE) == []
    (event,) = dropped_events(store)
    assert (event.job_id, event.queue, event.error) == (job.id, "q", DROPPED_INCOMPLETE + "queue)")
    assert counts(store) == {}
    assert index_problems(client) == []


def test_a_running_job_deleted_by_hand_frees_its_group_when_its_worker_finishes(
    store: RedisStore, client: Any
) -> None:
    first, second = store.job_insert_many([new_job(group="chat"), new_job(group="chat")], utcnow())
    (running,) = claim(store)
    client.delete(f"{P}job:{first.id}")
    # A heartbeat does not renew it (its worker learns the lease is lost) and drops nothing:
    # the group stays held while the lease runs, as for any lost lease.
    assert store.job_heartbeat([Lease(first.id, running.lease_token or "")], LEASE) == []
    assert counts(store) == {"queued": 1, "running": 1}
    assert complete(store, running) == []  # nothing to record the result in
    assert counts(store) == {"queued": 1}
    (nxt,) = claim(store)
    assert nxt.id == second.id
    assert [e.job_id for e in dropped_events(store)] == [first.id]
    # A second finish of the same lease finds nothing more to drop.
    assert complete(store, running) == []
    assert len(dropped_events(store)) == 1


def test_a_running_job_under_limits_frees_the_queue_and_its_key(
    store: RedisStore, client: Any
) -> None:
    now = utcnow()
    store.limit_set(LimitChange("api", Limit(concurrency=1)), now)
    store.limit_set(LimitChange("api", Limit(concurrency=1), per_key=True), now)
    jobs = store.job_insert_many(
        [new_job("api", limit_key="acme"), new_job("api", limit_key="acme"),
         new_job("api", limit_key="other")],
        now,
    )  # fmt: skip
    (running,) = claim(store, "api")
    assert running.id == jobs[0].id
    assert client.hgetall(f"{P}krun:{nm('api')}") == {"acme": "1"}
    client.delete(f"{P}job:{running.id}")
    assert claim(store, "api") == []  # the queue's one place is held

    store.job_rescue_expired(utcnow() + AFTER_THE_LEASE)
    assert client.hgetall(f"{P}krun:{nm('api')}") == {}  # the key's count is freed
    (status,) = store.limit_status(utcnow())
    assert status.running == 0
    assert counts(store, "api") == {"queued": 2}
    (nxt,) = claim(store, "api")
    assert nxt.id == jobs[1].id
    assert index_problems(client) == []


def test_a_running_job_whose_limit_key_is_unknown_has_its_key_counted_again(
    store: RedisStore, client: Any
) -> None:
    now = utcnow()
    store.limit_set(LimitChange("api", Limit(concurrency=1), per_key=True), now)
    jobs = store.job_insert_many(
        [new_job("api", limit_key="acme"), new_job("api", limit_key="zen"),
         new_job("api", limit_key="acme")],
        now,
    )  # fmt: skip
    held = claim(store, "api")
    assert [j.id for j in held] == [jobs[0].id, jobs[1].id]
    client.delete(f"{P}job:{jobs[0].id}")
    # The other's lease is renewed past the moment of the rescue.
    assert store.job_heartbeat([Lease(held[1].id, held[1].lease_token or "")], LEASE * 4)
    store.job_rescue_expired(utcnow() + AFTER_THE_LEASE)
    assert client.hgetall(f"{P}krun:{nm('api')}") == {"zen": "1"}
    (nxt,) = claim(store, "api")
    assert nxt.id == jobs[2].id
    assert index_problems(client) == []


# --- queued jobs whose hash is gone ----------------------------------------------------------


def test_a_claim_skips_and_drops_queued_jobs_it_cannot_read(store: RedisStore, client: Any) -> None:
    now = utcnow()
    later = new_job(run_at=now + timedelta(seconds=60))
    ready, gone, scheduled_gone, scheduled = store.job_insert_many(
        [new_job(priority=1), new_job(priority=5), later, later], now
    )
    client.delete(f"{P}job:{gone.id}", f"{P}job:{scheduled_gone.id}")
    assert counts(store) == {"queued": 4}

    (claimed,) = claim(store)
    assert claimed.id == ready.id  # the higher priority one is gone: no phantom, no error
    assert client.zcard(f"{P}ready:{nm('q')}") == 0
    assert counts(store) == {"queued": 2, "running": 1}
    assert [e.job_id for e in dropped_events(store)] == [gone.id]

    (due,) = claim(store, at=now + timedelta(seconds=61))  # the scheduled ones come due
    assert due.id == scheduled.id
    assert [e.job_id for e in dropped_events(store)] == [gone.id, scheduled_gone.id]
    assert counts(store) == {"running": 2}
    assert store.stats(now).queues["q"].scheduled == 0
    assert index_problems(client) == []


def test_a_queued_job_holding_a_limit_keys_line_gives_its_place(
    store: RedisStore, client: Any
) -> None:
    now = utcnow()
    store.limit_set(LimitChange("api", Limit(concurrency=1), per_key=True), now)
    first, second = store.job_insert_many(
        [new_job("api", limit_key="acme"), new_job("api", limit_key="acme")], now
    )
    client.delete(f"{P}job:{first.id}")
    # The claim that meets it takes nothing of the key (its line was full), and drops it.
    assert claim(store, "api") == []
    (claimed,) = claim(store, "api")
    assert claimed.id == second.id
    assert client.exists(f"{P}kq:{nm('api')}:acme") == 0
    assert index_problems(client) == []


def test_a_group_whose_waiting_head_is_deleted_goes_on_once_the_sweep_has_passed(
    store: RedisStore, client: Any
) -> None:
    head, nxt, last = store.job_insert_many([new_job(group="chat")] * 3, utcnow())
    client.delete(f"{P}job:{head.id}")
    # The claim meets the head in ready: and drops it, but a hash that is gone does
    # not say its group: the group's line keeps the id until the sweep finds it.
    assert claim(store) == []
    assert [e.job_id for e in dropped_events(store)] == [head.id]
    assert counts(store) == {"queued": 2}
    store.job_rescue_expired(utcnow())  # one slice of the sweep walks these few keys
    (claimed,) = claim(store)
    assert claimed.id == nxt.id
    # A job further down the line is dropped when its turn comes: the group knows it.
    client.delete(f"{P}job:{last.id}")
    more = store.job_insert_many([new_job(group="chat")], utcnow())[0]
    complete(store, claimed)
    (then,) = claim(store)
    assert then.id == more.id
    assert [e.job_id for e in dropped_events(store)] == [head.id, last.id]
    sweep_everything(store, client, utcnow())
    assert index_problems(client) == []


def test_a_key_held_by_a_deleted_job_is_free_for_a_new_one(store: RedisStore, client: Any) -> None:
    live = store.job_insert_many([new_job(key="k")], utcnow())[0]
    forever = store.job_insert_many([new_job("f", key="k", unique="forever")], utcnow())[0]
    client.delete(f"{P}job:{live.id}", f"{P}job:{forever.id}")
    (again,) = store.job_insert_many([new_job(key="k")], utcnow())
    (again_forever,) = store.job_insert_many([new_job("f", key="k", unique="forever")], utcnow())
    assert again.id not in (live.id, forever.id)
    assert again_forever.id not in (live.id, forever.id, again.id)
    assert store.job_get(again_forever.id) is not None
    assert sorted(e.job_id for e in dropped_events(store)) == [live.id, forever.id]
    # Their entries in ready: (a hash that is gone does not say its priority) go at the
    # next claim.
    assert [j.id for j in claim(store, "q")] == [again.id]
    assert [j.id for j in claim(store, "f")] == [again_forever.id]
    assert index_problems(client) == []


# --- what operators read -----------------------------------------------------------------


def test_listings_and_charts_skip_and_drop_the_jobs_they_cannot_read(
    store: RedisStore, client: Any
) -> None:
    now = utcnow()
    jobs = store.job_insert_many([new_job(batch="b") for _ in range(4)], now)
    for job in claim(store, limit=3):
        complete(store, job)
    client.delete(*(f"{P}job:{j.id}" for j in (jobs[0], jobs[3])))
    assert store.batch_status("b").counts == {"queued": 1, "succeeded": 3}

    page = listed(store, queue="q")
    assert sorted(j.id for j in page) == [jobs[1].id, jobs[2].id]
    assert counts(store) == {"succeeded": 2}  # the listing dropped what it met
    assert sorted(e.job_id for e in dropped_events(store)) == [jobs[0].id, jobs[3].id]
    # The batch's counts follow once the sweep has found the batch.
    sweep_everything(store, client, utcnow())
    assert store.batch_status("b").counts == {"succeeded": 2}
    # Charts and purges of finished jobs meet the same: a finished job gone by hand.
    client.delete(f"{P}job:{jobs[1].id}")
    slots = store.stats_finished_per_slot(now - timedelta(minutes=1), timedelta(minutes=5))
    assert sum(s.count for s in slots) == 1
    assert counts(store) == {"succeeded": 1}
    assert len(dropped_events(store)) == 3
    # Retention purges the finished job left, and the histories of the dropped ones
    # (what a hash that is gone listed of its events cannot be found: those stay).
    assert purge(store, utcnow() + timedelta(seconds=1)) == 1
    assert counts(store) == {}
    assert dropped_events(store) == []
    assert client.exists(P + "dropped", P + "dropped:at") == 0
    assert claim(store) == []  # meets the queued one's entry in ready:, which said no group
    sweep_everything(store, client, utcnow())
    assert index_problems(client) == []


def test_a_purge_drops_the_finished_jobs_it_cannot_read(store: RedisStore, client: Any) -> None:
    jobs = store.job_insert_many([new_job() for _ in range(3)], utcnow())
    for job in claim(store):
        complete(store, job)
    client.delete(f"{P}job:{jobs[1].id}")
    assert purge(store, utcnow() - timedelta(seconds=1)) == 0  # none finished so early
    assert purge(store, utcnow() + timedelta(seconds=1)) == 2
    assert counts(store) == {}
    assert index_problems(client) == []
    # Dropped at that purge, before its moment: its history went with it.
    assert dropped_events(store) == []


# --- a hash that lacks fields -------------------------------------------------------------


def test_a_hash_lacking_fields_is_dropped_naming_them(store: RedisStore, client: Any) -> None:
    jobs = store.job_insert_many([new_job(priority=9, group="g"), new_job(), new_job()], utcnow())
    client.hdel(f"{P}job:{jobs[0].id}", "args", "task")
    (claimed,) = claim(store, limit=1)  # the damaged one is first in line: passed over
    assert claimed.id == jobs[1].id
    (event,) = dropped_events(store)
    assert event.job_id == jobs[0].id
    assert event.error == DROPPED_INCOMPLETE + "task, args)"
    assert client.exists(f"{P}job:{jobs[0].id}") == 0  # what was left of it is gone too
    assert store.job_get(jobs[0].id) is None

    # A running job that loses a field: its finish drops it.
    client.hdel(f"{P}job:{claimed.id}", "created_at")
    assert complete(store, claimed) == []
    # One that an operator reads: job_get answers None and drops it.
    client.hdel(f"{P}job:{jobs[2].id}", "priority")
    assert store.job_get(jobs[2].id) is None
    assert [e.error for e in dropped_events(store)][1:] == [
        DROPPED_INCOMPLETE + "created_at)",
        DROPPED_INCOMPLETE + "priority)",
    ]
    assert counts(store) == {}
    assert claim(store) == []  # meets the last one's entry in ready:, whose priority was lost
    sweep_everything(store, client, utcnow())
    assert index_problems(client) == []


@pytest.mark.parametrize("field", redis_base._REQUIRED)
def test_every_field_a_job_has_is_checked(store: RedisStore, client: Any, field: str) -> None:
    (job,) = store.job_insert_many([new_job()], utcnow())
    client.hdel(f"{P}job:{job.id}", field)
    assert claim(store) == []
    assert [e.error for e in dropped_events(store)] == [f"{DROPPED_INCOMPLETE}{field})"]
    assert counts(store) == {}
    assert index_problems(client) == []


def test_ids_a_caller_names_that_never_existed_drop_nothing(store: RedisStore) -> None:
    (job,) = store.job_insert_many([new_job()], utcnow())
    assert store.job_get(job.id + 100) is None
    assert store.job_get_many([job.id, job.id + 100]) == [store.job_get(job.id)]
    assert dropped_events(store) == []


def test_operators_are_told_a_job_was_dropped_until_retention_purges_its_history(
    redis_clean_dsn: str, client: Any
) -> None:
    with App(redis_clean_dsn, retention_by_state={"failed": timedelta(days=30)}) as app:
        app.migrate()

        @app.task
        def work() -> None:
            return None

        job = work.enqueue()
        client.hdel(f"{P}job:{job.id}", "args")  # one lost field: no telling what to run
        with pytest.raises(JobNotFoundError, match=f"job {job.id} was dropped at .* UTC") as lost:
            app.get(job.id)
        assert str(lost.value).endswith(f"{DROPPED_INCOMPLETE}args)")
        assert [e.kind for e in app.events(job.id)] == ["enqueued", "dropped"]

        result = CliRunner().invoke(cli, ["jobs", "show", str(job.id), "--dsn", redis_clean_dsn])
        assert result.exit_code == 1
        assert f"job {job.id} was dropped at" in result.stderr
        assert "job data incomplete (no args)" in result.stderr
        with TestClient(create_app(app), base_url="http://127.0.0.1") as web:
            page = web.get(f"/jobs/{job.id}")
        assert page.status_code == 404
        assert f"job {job.id} was dropped at" in page.text

        app.apply_retention(utcnow() + timedelta(days=29))  # kept as long as a failed job
        assert [e.kind for e in app.events(job.id)] == ["enqueued", "dropped"]
        app.apply_retention(utcnow() + timedelta(days=31))
        with pytest.raises(JobNotFoundError, match="never created, or purged"):
            app.get(job.id)
        assert app.events(job.id) == []


# --- the sweep ----------------------------------------------------------------------------


def test_the_sweep_walks_in_slices_and_ids_dropped_meanwhile_wait_for_the_next_walk(
    store: RedisStore, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_core, "_SWEEP_KEYS", 10)
    monkeypatch.setattr(redis_core, "_SWEEP_SECONDS", 0)  # one slice a rescue
    store.job_insert_many([new_job(batch=f"b{n}") for n in range(50)], utcnow())
    first, _ = store.job_insert_many(
        [new_job(group="chat", batch="x"), new_job(group="chat", batch="x")], utcnow()
    )
    client.delete(f"{P}job:{first.id}")
    assert claim(store, limit=100)  # drops the head, a first lot for the sweep
    store.job_rescue_expired(utcnow())
    assert client.exists(P + "lost:sweeping") == 1  # the walk has begun
    assert client.exists(P + "lost") == 0
    # Dropped while the walk goes on: it waits in lost for the next one.
    (extra,) = store.job_insert_many([new_job(batch="y")], utcnow())
    client.delete(f"{P}job:{extra.id}")
    claim(store, limit=10)
    assert client.hkeys(P + "lost") == [str(extra.id)]
    rounds = 0
    while client.exists(P + "lost:sweeping"):
        store.job_rescue_expired(utcnow())
        rounds += 1
    assert rounds > 2  # many slices of 10 keys
    # The first lot is swept: of batch x only the second job is counted (queued, or
    # running when a slice promoted it before the claim above).
    assert sum(store.batch_status("x").counts.values()) == 1
    assert store.batch_status("y").counts == {"queued": 1}  # the second waits its walk
    sweep_everything(store, client, utcnow())
    assert store.batch_status("y").counts == {}
    assert index_problems(client) == []


# --- many hashes gone at once ---------------------------------------------------------------


def test_hashes_deleted_at_random_leave_every_index_right_once_met(
    store: RedisStore, client: Any
) -> None:
    """Jobs of groups, batches, keys and limit keys in every state lose their hashes at
    random (as an eviction would); claims, finishes, rescues and a listing meet them,
    and then every index and count agrees with the hashes left."""
    rng = random.Random(7)
    now = utcnow()
    store.limit_set(LimitChange("api", Limit(concurrency=3), per_key=True), now)
    new = []
    for _ in range(300):
        queue = rng.choice(["q", "api"])
        new.append(
            new_job(
                queue,
                group=rng.choice([None, "g1", "g2", "g3"]),
                batch=rng.choice([None, "b1", "b2"]),
                key=rng.choice([None, None, "k1", "k2"]),
                limit_key=rng.choice(["acme", "zen"]) if queue == "api" else None,
                priority=rng.randint(0, 3),
                run_at=now + timedelta(seconds=rng.choice([0, 0, 0, 30])),
            )
        )
    store.job_insert_many(new, now)
    held: list[Job] = []
    for _ in range(4):
        held += store.job_claim(["q", "api"], 20, "w", LEASE, now=now)
        done, held = held[:15], held[15:]
        store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in done], now)
    victims = rng.sample(sorted(client.scan_iter(match=P + "job:*")), 90)
    client.delete(*victims)
    assert index_problems(client)

    at = now + timedelta(seconds=31)
    store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in held], at)
    # Claims meet the queued ones, a listing the finished ones; the sweep frees the
    # groups whose waiting head was lost, and their next jobs run.
    while claimed := store.job_claim(["q", "api"], 50, "w", LEASE, now=at):
        store.job_finish([Finish.complete(j.id, j.lease_token or "", None) for j in claimed], at)
        if len(claimed) < 50:
            listed(store, limit=10_000)
            sweep_everything(store, client, at)
    assert index_problems(client) == []
    left = len(list(client.scan_iter(match=P + "job:*")))
    assert sum(counts(store, "q").values()) + sum(counts(store, "api").values()) == left
    assert counts(store, "q").keys() <= {"succeeded"}
    assert counts(store, "api").keys() <= {"succeeded"}
    assert len(dropped_events(store)) == 90


# --- a worker -----------------------------------------------------------------------------


def test_a_worker_goes_on_with_a_group_after_its_running_job_was_deleted(
    redis_clean_dsn: str,
) -> None:
    release = threading.Event()
    with App(redis_clean_dsn) as app:
        app.migrate()
        ran: list[int] = []

        @app.task
        def step(n: int) -> int:
            if n == 1:
                release.wait(10)
            ran.append(n)
            return n

        client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
        try:
            with app.worker(concurrency=4, lease=5):
                first = step.options(group="chat").enqueue(1)
                second = step.options(group="chat").enqueue(2)
                wait_until(lambda: app.get(first.id).state == JobState.RUNNING)
                client.delete(f"{P}job:{first.id}")
                release.set()
                assert second.wait(timeout=10) == 2
            assert ran == [1, 2]
            assert app.store.job_get(first.id) is None
            assert app.stats().queues["default"].counts == {"succeeded": 1}
            dropped = [e for e in app.store.event_since(0, 1000) if e.kind == "dropped"]
            assert [(e.job_id, e.error) for e in dropped] == [(first.id, DROPPED_MISSING)]
        finally:
            release.set()
            client.close()


def test_a_worker_goes_on_with_a_group_whose_running_job_never_finishes(
    redis_clean_dsn: str,
) -> None:
    """The handler of the deleted job hangs: its lease runs out and the rescue of the
    worker's maintenance drops it, after which the group's next job runs."""
    release = threading.Event()
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task
        def step(n: int) -> int:
            if n == 1:
                release.wait(20)
            return n

        client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
        try:
            with app.worker(concurrency=4, lease=1, stop_timeout=1):
                first = step.options(group="chat").enqueue(1)
                second = step.options(group="chat").enqueue(2)
                wait_until(lambda: app.get(first.id).state == JobState.RUNNING)
                client.delete(f"{P}job:{first.id}")
                assert second.wait(timeout=15) == 2
                release.set()
            assert app.stats().queues["default"].counts == {"succeeded": 1}
            assert [e.job_id for e in app.store.event_since(0, 1000) if e.kind == "dropped"] == [
                first.id
            ]
        finally:
            release.set()
            client.close()
