"""What only the Redis store has: its DSNs, its server's persistence, its pub/sub
wake-ups across processes, and a redis-server crash in the middle of a run.

The contract itself (the state machine) runs on Redis in test_store_contract.py,
test_store_model.py and the worker, consume, limits and crash tests.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
import redis

import crash_app
from conveyor import App, Context, JobState
from conveyor.errors import ConfigurationError, StoreUnavailableError
from conveyor.job import NewJob, utcnow
from conveyor.store.dsn import open_store
from conveyor.store.protocols import DurabilityReport, Store, TransactionalStore
from conveyor.store.records import Finish
from conveyor.store.redis import RedisStore
from outcomes import cancel_one
from redis_server import RedisServer
from test_crash import Fleet, counts
from waiting import wait_until

T = TypeVar("T")
pytestmark = pytest.mark.redis


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def new_job(queue: str = "default", task: str = "t") -> NewJob:
    return NewJob(queue=queue, task=task, args_json="[]", kwargs_json="{}", run_at=utcnow())


# --- DSNs ------------------------------------------------------------------------------


def test_an_unreachable_redis_is_unavailable_naming_host_and_port() -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{port}") as caught:
        open_store(f"redis://127.0.0.1:{port}/0", connect_timeout=2)
    assert "Is the server running" in str(caught.value)
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{port}"):
        App(f"redis://127.0.0.1:{port}/0", connect_timeout=2)


def test_a_malformed_redis_dsn_says_what_to_write() -> None:
    with pytest.raises(ConfigurationError, match="port is not a number"):
        open_store("redis://localhost:notaport/0")


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A server that wants a user and password, and listens on a unix socket too."""
    server = RedisServer(extra=("--requirepass", "s3cret"))
    server.extra += ["--unixsocket", str(server.dir / "redis.sock"), "--unixsocketperm", "700"]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_user_and_password_come_from_the_dsn_and_never_reach_messages(
    locked_server: RedisServer,
) -> None:
    port = locked_server.port
    store = open_store(f"redis://default:s3cret@127.0.0.1:{port}/1")
    try:
        assert "s3cret" not in store.description
        assert store.description == f"Redis at 127.0.0.1:{port}"
        store.migrate()
        (job,) = store.job_insert_many([new_job()], utcnow())
        assert store.job_get(job.id) is not None
    finally:
        store.close()
    with pytest.raises(Exception, match=r"(?i)auth|password") as caught:
        open_store(f"redis://default:wrong@127.0.0.1:{port}/1")
    assert "wrong" not in str(caught.value)


def test_a_unix_socket_dsn_opens_the_same_store(locked_server: RedisServer) -> None:
    path = locked_server.dir / "redis.sock"
    store = open_store(f"unix://:s3cret@{path}?db=2")
    try:
        assert str(path) in store.description
        store.migrate()
        (job,) = store.job_insert_many([new_job(queue="sock")], utcnow())
        (claimed,) = store.job_claim(["sock"], 1, "w", timedelta(seconds=30))
        assert claimed.id == job.id
    finally:
        store.close()


def test_enqueue_inside_a_caller_transaction_is_refused_clearly(redis_clean_dsn: str) -> None:
    store = open_store(redis_clean_dsn)
    try:
        with pytest.raises(ConfigurationError, match="needs SQLite or PostgreSQL"):
            store.job_insert_many([new_job()], utcnow(), connection=object())
        assert store.queue_names() == []  # nothing was written
        assert store.event_offset() == (0, 0)
    finally:
        store.close()


# --- layout, keys, clock ------------------------------------------------------------------


def test_every_key_shares_one_hash_tag(redis_clean_dsn: str) -> None:
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task(queue="q:with:colons")
        def work(n: int) -> int:
            return n

        work.options(group="g", batch="b", key="k").enqueue(1)
        app.run_worker(queues=["q:with:colons"], burst=True)
        client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
        try:
            keys = list(client.scan_iter("*"))
        finally:
            client.close()
    assert keys, "the enqueue wrote keys"
    assert all(k.startswith("{conveyor}:") for k in keys), keys


def test_claims_judge_time_on_the_redis_clock(redis_clean_dsn: str) -> None:
    store = open_store(redis_clean_dsn)
    try:
        store.migrate()
        client = redis.Redis.from_url(redis_clean_dsn)
        seconds, micros = client.time()
        client.close()
        server_now = seconds + micros / 1e6
        (job,) = store.job_insert_many([new_job()], utcnow())
        (claimed,) = store.job_claim(["default"], 1, "w", timedelta(seconds=60))
        assert claimed.id == job.id
        assert claimed.started_at is not None and claimed.lease_expires_at is not None
        assert abs(claimed.started_at.timestamp() - server_now) < 5
        lease = (claimed.lease_expires_at - claimed.started_at).total_seconds()
        assert lease == pytest.approx(60, abs=0.01)
    finally:
        store.close()


def test_schema_version_is_the_stored_layout(redis_clean_dsn: str) -> None:
    store = open_store(redis_clean_dsn)
    try:
        assert store.schema_version() == 0
        assert store.migrate() == store.schema_latest() == 3
        assert store.schema_version() == 3
        client = redis.Redis.from_url(redis_clean_dsn)
        client.hset("{conveyor}:meta", "layout", "99")
        client.close()
        with pytest.raises(ConfigurationError, match="upgrade conveyor"):
            store.migrate()
    finally:
        store.close()


def test_layout_1_migrates_forward_with_its_running_jobs_and_history(redis_clean_dsn: str) -> None:
    """Layout 1 kept running jobs by id with a separate leases set, and named each event's
    fields: migrate() scores the running sets by lease, and the old events still read."""
    store = open_store(redis_clean_dsn)
    client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
    try:
        store.migrate()
        (job,) = store.job_insert_many([new_job()], utcnow())
        (claimed,) = store.job_claim(["default"], 1, "w", timedelta(seconds=1))
        running, events = "{conveyor}:qs:7.default:running", "{conveyor}:events"
        # What layout 1 held: the running set by id, the leases set, named event fields.
        client.zadd(running, {str(job.id): job.id})
        client.zadd("{conveyor}:leases", {str(job.id): 1.0})
        seq = client.incr("{conveyor}:seq")
        old_fields = {"job_id": job.id, "queue": "default", "task": "t", "kind": "old",
                      "attempt": 1, "at": "1.5", "worker": "w"}  # fmt: skip
        client.xadd(events, old_fields, id=f"{seq}-0")
        client.hset("{conveyor}:meta", "layout", "1")
        assert store.migrate() == 3
        assert client.exists("{conveyor}:leases") == 0
        assert claimed.lease_expires_at is not None
        assert client.zscore(running, str(job.id)) == claimed.lease_expires_at.timestamp()
        old = store.event_since(0, 10)[-1]
        assert (old.kind, old.attempt, old.worker, old.error) == ("old", 1, "w", None)
        assert [e.kind for e in store.event_list(job.id)] == ["enqueued", "claimed"]
        assert store.job_rescue_expired(now=utcnow() + timedelta(seconds=30)) == [job.id]
    finally:
        client.close()
        store.close()


def test_layout_2_migrates_forward_marking_the_jobs_others_wait_for(redis_clean_dsn: str) -> None:
    """Layout 3 reads a job's children only when its hash says it has some: migrate()
    marks the parents linked under layout 2, whose children then still wait for them."""
    store = open_store(redis_clean_dsn)
    client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
    try:
        store.migrate()
        (parent,) = store.job_insert_many([new_job()], utcnow())
        (child,) = store.job_insert_many(
            [dataclasses.replace(new_job(), after=(parent.id,))], utcnow()
        )
        (alone,) = store.job_insert_many([new_job()], utcnow())
        assert store.job_get(child.id).state == JobState.WAITING  # type: ignore[union-attr]
        # What layout 2 held: the edge without the mark.
        assert client.hget(f"{{conveyor}}:job:{parent.id}", "children") == "1"
        client.hdel(f"{{conveyor}}:job:{parent.id}", "children")
        client.hset("{conveyor}:meta", "layout", "2")
        assert store.migrate() == 3
        assert client.hget(f"{{conveyor}}:job:{parent.id}", "children") == "1"
        assert client.hget(f"{{conveyor}}:job:{alone.id}", "children") is None
        claimed = store.job_claim(["default"], 2, "w", timedelta(seconds=30))
        assert [j.id for j in claimed] == [parent.id, alone.id]
        store.job_finish([Finish(j.id, j.lease_token or "", "complete") for j in claimed])
        assert store.job_get(child.id).state == JobState.QUEUED  # type: ignore[union-attr]
    finally:
        client.close()
        store.close()


# --- persistence -----------------------------------------------------------------------


def test_health_and_the_start_line_report_persistence(
    redis_clean_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with App(redis_clean_dsn) as app:
        app.migrate()
        health = app.health()
        assert health["ok"] is True
        assert "appendonly yes" in health["persistence"]
        assert "appendfsync everysec" in health["persistence"]
        assert "warning" not in health

        @app.task
        def noop() -> None:
            return None

        with caplog.at_level(logging.INFO, logger="conveyor.worker"), app.worker(concurrency=1):
            pass
        starts = [r.getMessage() for r in caplog.records if "starting" in r.getMessage()]
        assert starts and "appendonly yes, appendfsync everysec" in starts[0]


def test_persistence_off_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(extra=("--appendonly", "no"))
    server.start()
    try:
        with App(server.dsn) as app:
            app.migrate()
            health = app.health()
            assert health["ok"] is True
            assert "appendonly no" in health["persistence"]
            assert "persistence is OFF" in health["warning"]

            @app.task
            def noop() -> None:
                return None

            with (
                caplog.at_level(logging.INFO, logger="conveyor.worker"),
                app.worker(concurrency=1),
            ):
                pass
            warned = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert any("persistence is OFF" in r.getMessage() for r in warned)
    finally:
        server.stop()


def test_an_evicting_memory_policy_is_warned_about() -> None:
    server = RedisServer(extra=("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))
    server.start()
    try:
        with App(server.dsn) as app:
            app.migrate()
            health = app.health()
            assert health["ok"] is True
            assert "maxmemory-policy allkeys-lru" in health["warning"]
            assert "persistence" not in health["warning"]  # appendonly yes: only this
    finally:
        server.stop()


def test_a_server_without_config_is_reported_as_unknown() -> None:
    server = RedisServer(extra=("--rename-command", "CONFIG", ""))
    server.start()
    try:
        with App(server.dsn) as app:
            app.migrate()
            health = app.health()
            assert health["ok"] is True
            assert health["persistence"] == "persistence unknown"
            assert "CONFIG is disabled" in health["warning"]
    finally:
        server.stop()


# --- wake-ups across processes -----------------------------------------------------------


def test_a_cancel_from_another_process_reaches_a_running_job_within_a_second(
    redis_clean_dsn: str,
) -> None:
    """The canceller is another App (another connection, no shared memory): only the
    store's pub/sub carries the cancel to the worker."""
    started = threading.Event()
    noticed: list[float] = []

    with App(redis_clean_dsn) as worker_app, App(redis_clean_dsn) as other:
        worker_app.migrate()

        @worker_app.task
        def loop(ctx: Context) -> str:
            started.set()
            give_up = time.monotonic() + 20
            while not ctx.cancelled and time.monotonic() < give_up:
                time.sleep(0.005)
            noticed.append(time.monotonic())
            return "stopped"

        with worker_app.worker(concurrency=1, lease=30, poll_interval=30):
            job = loop.enqueue()
            assert started.wait(10)
            asked = time.monotonic()
            other.cancel(job.id)
            wait_until(lambda: noticed, timeout=10)
            assert noticed[0] - asked < 1.0
            wait_until(lambda: other.get(job.id).state == JobState.CANCELLED, timeout=10)


def test_an_enqueue_from_another_process_wakes_an_idle_worker_at_once(
    redis_clean_dsn: str,
) -> None:
    started: list[float] = []
    with App(redis_clean_dsn) as worker_app, App(redis_clean_dsn) as producer:
        worker_app.migrate()

        @worker_app.task(name="ping")
        def ping() -> None:
            started.append(time.monotonic())

        with worker_app.worker(concurrency=1, poll_interval=30):
            time.sleep(0.5)  # idle, subscribed, asleep on a 30 s poll
            for _ in range(3):
                before = len(started)
                sent = time.monotonic()
                producer.store.job_insert_many([new_job(task="ping")], utcnow())
                wait_until(lambda b=before: len(started) > b, timeout=10)
                assert started[-1] - sent < 1.0


def test_the_subscription_comes_back_after_redis_restarts() -> None:
    server = RedisServer()
    server.start()
    try:
        store = open_store(server.dsn, connect_timeout=2)
        heard: list[tuple[str, str]] = []
        subscription = store.subscribe(lambda channel, payload: heard.append((channel, payload)))
        try:
            wait_until(lambda: ("reconnected", "") in heard, timeout=10)
            store.migrate()
            store.job_insert_many([new_job(queue="before")], utcnow())
            wait_until(lambda: ("jobs", "before") in heard, timeout=10)
            heard.clear()
            server.restart()
            # After the reconnect it says so (messages may have been missed) ...
            wait_until(lambda: ("reconnected", "") in heard, timeout=20)

            def enqueued() -> bool:
                try:
                    store.job_insert_many([new_job(queue="after")], utcnow())
                except StoreUnavailableError:
                    return False
                return True

            wait_until(enqueued, timeout=20)
            # ... and hears new work again.
            wait_until(lambda: ("jobs", "after") in heard, timeout=10)
        finally:
            subscription.close()
            store.close()
    finally:
        server.stop()


# --- redis-server crashes mid-run ---------------------------------------------------------


def test_redis_killed_mid_run_loses_no_acknowledged_job(tmp_path: Path) -> None:
    """appendfsync always: every write Redis acknowledged is on disk before the reply,
    so a SIGKILL of redis-server loses none of them; every job still ends, once."""
    server = RedisServer(appendfsync="always")
    server.start()
    workers: Fleet | None = None
    app: App | None = None
    try:
        dsn = server.dsn
        app = crash_app.build(dsn, connect_timeout=2)
        app.migrate()
        workers = Fleet(dsn, tmp_path)
        long_job = app.tasks["until_cancelled"].enqueue(60.0)
        procs = [workers.spawn("--concurrency", "4", "--lease", "3") for _ in range(2)]
        wait_until(lambda: app.get(long_job.id).state == JobState.RUNNING, 20, "long job runs")
        jobs = app.tasks["pause"].enqueue_many([((0.02, n), {}) for n in range(500)])
        wait_until(lambda: counts(app)["succeeded"] >= 100, 30, "a fifth of the jobs done")
        assert counts(app)["queued"] >= 100  # the crash comes in the middle of the run

        def retried(call: Callable[[], T]) -> T | None:
            try:
                return call()
            except Exception:  # the server is away: try again
                return None

        restart = threading.Thread(target=server.restart)
        restart.start()
        try:
            # Keyed: an enqueue whose answer was lost cannot create a second job.
            late = wait_until(
                lambda: retried(
                    lambda: app.tasks["pause"].options(key="during-restart").enqueue(0.0, -1)
                ),
                30,
                "an enqueue is accepted",
            )
            cancel = wait_until(
                lambda: retried(lambda: app.cancel(long_job.id)), 30, "a cancel is accepted"
            )
        finally:
            restart.join()
        assert cancel.cancel_requested or cancel.state == JobState.CANCELLED
        ids = [j.id for j in jobs]

        def all_done() -> bool:
            # The workers ride out the crash: none of them exits.
            assert [p.poll() for p in procs] == [None, None], workers.logs(40)
            return all(j.state == JobState.SUCCEEDED for j in app.store.job_get_many(ids))

        wait_until(all_done, 90, "every job completes after the restart")
        assert app.wait(late.id, timeout=30) == -1
        wait_until(
            lambda: app.get(long_job.id).state == JobState.CANCELLED, 30, "the long job ends"
        )
        assert [p.poll() for p in procs] == [None, None], workers.logs()
        assert len(app.jobs(limit=1000)) == 502
        succeeded = Counter(
            e.job_id for e in app.store.event_since(0, 100_000) if e.kind == "succeeded"
        )
        assert all(succeeded[i] == 1 for i in [*ids, late.id])
    finally:
        if workers is not None:
            workers.close()
        if app is not None:
            app.close()
        server.stop()


def test_the_store_is_a_redis_store(redis_clean_dsn: str) -> None:
    store = open_store(redis_clean_dsn)
    try:
        assert isinstance(store, RedisStore)
        assert isinstance(store, Store) and isinstance(store, DurabilityReport)
        assert not isinstance(store, TransactionalStore)
    finally:
        store.close()
    assert os.environ.get("CONVEYOR_TEST_FAST") != "1"  # deselected in the fast loop


def test_a_long_line_of_one_group_is_never_walked_by_a_claim(redis_clean_dsn: str) -> None:
    """Only a group's oldest queued job is in the claim's index: a claim beside a
    busy group of a thousand jobs looks at one entry for it, and the next job of
    the group takes its place when it leaves."""
    store = open_store(redis_clean_dsn)
    client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
    try:
        store.migrate()
        line = [dataclasses.replace(new_job(), group="chat-1") for _ in range(1000)]
        first, *rest = store.job_insert_many(line, utcnow())
        (loose,) = store.job_insert_many([new_job()], utcnow())
        assert client.zcard("{conveyor}:ready:7.default") == 2
        claimed = store.job_claim(["default"], 10, "w", timedelta(seconds=30))
        assert sorted(j.id for j in claimed) == [first.id, loose.id]
        assert store.job_claim(["default"], 10, "w", timedelta(seconds=30)) == []
        head = next(j for j in claimed if j.id == first.id)
        store.job_finish([Finish.complete(head.id, head.lease_token or "", None)])
        (second,) = store.job_claim(["default"], 10, "w", timedelta(seconds=30))
        assert second.id == rest[0].id
        # A cancel of the head hands its place on, too.
        cancel_one(store, rest[1].id, utcnow())
        store.job_finish([Finish.complete(second.id, second.lease_token or "", None)])
        (third,) = store.job_claim(["default"], 10, "w", timedelta(seconds=30))
        assert third.id == rest[2].id
    finally:
        client.close()
        store.close()
