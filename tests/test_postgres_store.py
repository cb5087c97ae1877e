"""The PostgreSQL store against the SQLite reference, step by step, plus what only PostgreSQL has.

The main test plays one scripted scenario (fixed clock) on a SQLiteStore and on a
PostgresStore and compares everything they answer, the jobs they hold and the
events they wrote. The others check notifications, the group-race retry of the
claim, many concurrent claimers, external transactions and connection errors.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor.errors import ConfigurationError, JobStateError, StoreUnavailableError
from conveyor.job import Event, Job, JobState, NewJob
from conveyor.store.postgres import PostgresStore
from conveyor.store.protocols import DurabilityReport, Store, TransactionalStore
from conveyor.store.records import Finish, Lease
from conveyor.store.sqlite import SQLiteStore
from outcomes import Failure, cancel_one, cancelled, listed, purge, released, retry_one

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new(
    queue: str = "default",
    *,
    task: str = "work",
    args: Any = (),
    kwargs: Any = None,
    key: str | None = None,
    unique: str = "live",
    group: str | None = None,
    batch: str | None = None,
    priority: int = 0,
    run_at: datetime = T0,
    max_attempts: int = 3,
) -> NewJob:
    return NewJob(
        queue=queue,
        task=task,
        args_json=json.dumps(list(args)),
        kwargs_json=json.dumps(kwargs or {}),
        run_at=run_at,
        priority=priority,
        max_attempts=max_attempts,
        key=key,
        unique=unique,  # type: ignore[arg-type]
        group=group,
        batch=batch,
    )


@pytest.fixture
def pg(pg_clean_dsn: str) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_clean_dsn, migrate=True)
    yield store
    store.close()


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "ref.db")
    yield store
    store.close()


# --- the scenario, played on both stores ---------------------------------------------


class Recorder:
    """Normalises answers so the two backends can be compared value by value."""

    def __init__(self) -> None:
        self.trace: list[tuple[str, Any]] = []
        self.tokens: dict[str, str] = {}

    def token(self, value: str | None) -> str | None:
        if value is None:
            return None
        return self.tokens.setdefault(value, f"token{len(self.tokens)}")

    def job(self, job: Job | None) -> Any:
        if job is None:
            return None
        row = {f.name: getattr(job, f.name) for f in fields(job) if f.name != "_app"}
        row["lease_token"] = self.token(job.lease_token)
        # jsonb normalises spacing and key order: compare decoded values.
        for name in ("args_json", "kwargs_json", "result_json"):
            row[name] = None if row[name] is None else json.loads(row[name])
        for name, value in row.items():
            if isinstance(value, datetime):
                assert value.utcoffset() == timedelta(0), f"{name} is not UTC: {value!r}"
                row[name] = value.astimezone(UTC)
        return row

    def event(self, event: Event) -> Any:
        # seq numbers the stored log, which differs: PostgreSQL writes one enqueued
        # event per enqueue statement, SQLite one a job. Compared in order, unnumbered.
        return {**asdict(event), "seq": None}

    def note(self, label: str, value: Any) -> Any:
        if isinstance(value, Job) or value is None:
            self.trace.append((label, self.job(value)))
        elif isinstance(value, list) and value and isinstance(value[0], Job):
            self.trace.append((label, [self.job(j) for j in value]))
        elif isinstance(value, list) and value and isinstance(value[0], Event):
            self.trace.append((label, [self.event(e) for e in value]))
        else:
            self.trace.append((label, value))
        return value


def scenario(store: Store) -> list[tuple[str, Any]]:
    r = Recorder()
    note = r.note

    # Enqueue: plain, keyed live (and an in-batch duplicate), keyed forever, groups,
    # priorities, another queue, a deferred job, a batch.
    first = note(
        "insert",
        store.job_insert_many(
            [
                new(args=[1], kwargs={"b": 2, "a": 1}),
                new(key="k1", args=["first"]),
                new(key="k1", args=["dup in batch"]),
                new(key="k2", unique="forever"),
                new(group="g1", priority=9),
                new(group="g1", priority=9),
                new(group="g2"),
                new(priority=5, batch="b1"),
                new("other", batch="b1"),
                new(run_at=at(3600)),
                new(max_attempts=1),
            ],
            T0,
        ),
    )
    ids = [j.id for j in first]
    note("insert same live key", store.job_insert_many([new(key="k1"), new(key="k3")], at(1)))
    note("insert empty", store.job_insert_many([], at(1)))
    note("get", store.job_get(ids[0]))
    note("get missing", store.job_get(10_000))
    note("get many", store.job_get_many([ids[3], 10_000, ids[0], ids[3]]))
    note("next run in", store.next_run_in(["default", "other"], at(1)))
    note("next run in other", store.next_run_in(["other"], at(1)))
    note("next run in none", store.next_run_in(["nothing"], at(1)))

    # Pause a queue: claims skip it, stats show it even when empty.
    store.queue_pause("other", at(2))
    store.queue_pause("empty", at(2))
    note("paused", sorted(store.queue_paused()))
    note("claim from paused", store.job_claim(["other"], 10, "w0", LEASE, at(2)))

    # Claim with priorities and groups: one job per group, oldest first.
    claimed = note("claim 4", store.job_claim(["default", "other"], 4, "w1", LEASE, at(5)))
    leases = {j.id: Lease(j.id, j.lease_token or "") for j in claimed}
    note("claim group g2", store.job_claim(["default"], 5, "w2", LEASE, at(6), group="g2"))
    note("claim group g1 busy", store.job_claim(["default"], 5, "w2", LEASE, at(6), group="g1"))
    note("stats", store.stats(at(7)))

    # Heartbeat: a good and a stale token.
    some = next(iter(leases.values()))
    note(
        "heartbeat",
        sorted(
            (s.id, s.cancel_requested)
            for s in store.job_heartbeat([some, Lease(some.id, "stale")], LEASE, at(8))
        ),
    )
    note("progress", store.job_progress(some, 0.5, "half", at(8)))
    note("progress keeps fraction", store.job_progress(some, None, "msg", at(8)))
    note("progress stale", store.job_progress(Lease(some.id, "stale"), 0.9, "x", at(8)))

    # Finish them four ways, with stale tokens mixed in.
    a, b, c, d = (leases[j.id] for j in claimed)
    note(
        "complete",
        store.job_finish(
            [
                Finish.complete(a.id, a.token, '{"ok": [1, 2]}'),
                Finish.complete(b.id, "stale", None),
            ],
            at(9),
        ),
    )
    note("complete again", store.job_finish([Finish.complete(a.id, a.token, "1")], at(9)))
    note(
        "fail",
        sorted(
            store.job_finish(
                [
                    Failure(b.id, b.token, "boom\nTraceback", at(60)),
                    Failure(c.id, c.token, "fatal", at(60), retryable=False),
                    Failure(a.id, a.token, "late", at(60)),
                ],
                at(10),
            )
        ),
    )
    note("snooze", store.job_finish([Finish.snooze(d.id, d.token, at(120))], at(11)))
    note("snooze stale", store.job_finish([Finish.snooze(d.id, d.token, at(120))], at(11)))
    for job_id in [*ids, ids[-1] + 1, ids[-1] + 2]:
        note(f"job {job_id}", store.job_get(job_id))

    # Claim again, release one, cancel one while running, finish it as cancelled.
    more = note("claim more", store.job_claim(["default"], 3, "w3", LEASE, at(20)))
    ls = [Lease(j.id, j.lease_token or "") for j in more]
    note("release", store.job_finish(released([ls[0], Lease(ls[1].id, "stale")]), at(21)))
    note("cancel running", cancel_one(store, ls[1].id, at(22)))
    note("cancel running twice", cancel_one(store, ls[1].id, at(22)))
    note(
        "heartbeat sees cancel",
        sorted((s.id, s.cancel_requested) for s in store.job_heartbeat(ls[1:], LEASE, at(23))),
    )
    note("set cancelled stale", store.job_finish(cancelled([Lease(ls[1].id, "x")]), at(24)))
    note("set cancelled", store.job_finish(cancelled([ls[1]]), at(24)))
    if len(ls) > 2:
        # A pending cancel wins over a retryable failure.
        note("cancel 3rd", cancel_one(store, ls[2].id, at(24)))
        note(
            "fail with cancel pending",
            store.job_finish([Failure(ls[2].id, ls[2].token, "e", at(99))], at(25)),
        )

    # Cancel queued and terminal jobs, and a missing one.
    note("cancel queued", cancel_one(store, ids[9], at(26)))
    note("cancel terminal", cancel_one(store, ids[9], at(27)))
    note("cancel missing", cancel_one(store, 10_000, at(27)))

    # Rescue: leases expire; one job runs out of attempts, one had a cancel pending.
    store.queue_resume("other", at(28))
    rest = note("claim rest", store.job_claim(["default", "other"], 10, "w4", LEASE, at(200)))
    if rest:
        note("cancel one of the rest", cancel_one(store, rest[0].id, at(201)))
    note("rescue too early", store.job_rescue_expired(at(205)))
    note("rescue", sorted(store.job_rescue_expired(at(300))))
    note("rescue again", store.job_rescue_expired(at(300)))
    again = note(
        "claim after rescue", store.job_claim(["default", "other"], 10, "w5", LEASE, at(301))
    )
    note("rescue limited", sorted(store.job_rescue_expired(at(400), limit=1)))
    note("rescue rest", sorted(store.job_rescue_expired(at(400))))
    del again

    # Manual retry: failed/cancelled only; not while another live job holds the key.
    for job_id in ids:
        try:
            note(f"retry {job_id}", retry_one(store, job_id, at(500)))
        except JobStateError as exc:
            note(f"retry {job_id} refused", str(exc))
    note("retry missing", retry_one(store, 10_000, at(500)))
    # The key k1 job: finish it, enqueue k1 again (live), and retrying the old one is refused.
    k1 = store.job_get(ids[1])
    assert k1 is not None
    if k1.state in (JobState.QUEUED,):
        got = store.job_claim(["default"], 100, "w6", LEASE, at(501))
        note("claim for k1", got)
        for job in got:
            store.job_finish([Failure(job.id, job.lease_token or "", "x", at(502), False)], at(502))
    note("k1 now", store.job_get(ids[1]))
    note("insert k1 live again", store.job_insert_many([new(key="k1")], at(503)))
    try:
        note("retry k1", retry_one(store, ids[1], at(504)))
    except JobStateError as exc:
        note("retry k1 refused", str(exc))
    # Forever keys match terminal jobs until they are purged.
    k2 = store.job_get(ids[3])
    note("k2 state", None if k2 is None else str(k2.state))
    note("insert k2 forever", store.job_insert_many([new(key="k2", unique="forever")], at(505)))
    note("insert k2 live", store.job_insert_many([new(key="k2")], at(505)))

    # Lists, events, stats, purge.
    note("list all", listed(store, limit=1000))
    note("list failed", listed(store, state=JobState.FAILED))
    note("list batch", listed(store, batch="b1"))
    note("list other", listed(store, queue="other", task="work"))
    note("list page", listed(store, before_id=ids[5], limit=2))
    for job_id in ids:
        note(f"events {job_id}", store.event_list(job_id))
    note("events since", [e for e in store.event_since(0, 1000) if e.kind != "enqueued"])
    note("stats late", store.stats(at(530)))
    note("stats later", store.stats(at(5000)))
    note("purge none", purge(store, at(0)))
    note("purge 2", purge(store, at(10_000), limit=2))
    note("purge rest", purge(store, at(10_000)))
    note("after purge", listed(store, limit=1000))
    note("events after purge", [e for e in store.event_since(0, 1000) if e.kind != "enqueued"])
    note("insert k2 after purge", store.job_insert_many([new(key="k2", unique="forever")], at(600)))

    # Workers and leaders.
    store.worker_register("w-a", "host", 12, ["default", "other"], 4, at(700))
    store.worker_register("w-b", "host", 13, ["x"], 1, at(701))
    store.worker_register("w-a", "host", 12, ["default", "other"], 4, at(702))
    store.worker_beat("w-b", 3, at(703))
    note("workers", store.worker_list())
    note("prune", store.worker_prune(at(702)))
    store.worker_unregister("w-b")
    note("workers after", store.worker_list())
    note("leader a", store.leader_acquire("m", "a", timedelta(seconds=10), at(800)))
    note("leader b refused", store.leader_acquire("m", "b", timedelta(seconds=10), at(805)))
    note("leader a renews", store.leader_acquire("m", "a", timedelta(seconds=10), at(809)))
    note("leader b after expiry", store.leader_acquire("m", "b", timedelta(seconds=10), at(820)))
    store.leader_release("m", "a")  # not the holder: no effect
    note("leader a refused", store.leader_acquire("m", "a", timedelta(seconds=10), at(821)))
    store.leader_release("m", "b")
    note("leader a after release", store.leader_acquire("m", "a", timedelta(seconds=10), at(822)))
    return r.trace


def test_same_answers_as_sqlite(lite: SQLiteStore, pg: PostgresStore) -> None:
    expected = scenario(lite)
    actual = scenario(pg)
    assert len(actual) == len(expected)
    for (label, want), (label2, got) in zip(expected, actual, strict=True):
        assert label == label2
        assert got == want, label


# --- what only PostgreSQL does ----------------------------------------------------------


def test_description_and_flags(pg: PostgresStore, pg_clean_dsn: str) -> None:
    assert isinstance(pg, Store) and isinstance(pg, TransactionalStore)
    assert not isinstance(pg, DurabilityReport)
    assert pg.description.startswith("PostgreSQL at 127.0.0.1:")
    assert pg.description.endswith("/" + pg_clean_dsn.rsplit("/", 1)[1])
    assert "@" not in pg.description
    pg.ping()
    assert pg.schema_version() == pg.migrate() >= 2


def test_not_migrated_unless_asked(pg_clean_dsn: str) -> None:
    store = PostgresStore(pg_clean_dsn)
    try:
        assert store.schema_version() == 0
        latest = store.migrate()
        assert store.schema_version() == latest
    finally:
        store.close()


def test_concurrent_migrators_apply_once(pg_clean_dsn: str) -> None:
    stores = [PostgresStore(pg_clean_dsn) for _ in range(4)]
    try:
        results: list[int] = []
        threads = [threading.Thread(target=lambda s=s: results.append(s.migrate())) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(results)) == 1 and len(results) == 4
        with psycopg.connect(pg_clean_dsn) as conn:
            rows = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        assert [r[0] for r in rows] == list(range(1, results[0] + 1))
    finally:
        for s in stores:
            s.close()


def test_unreachable_server_is_reported_quickly_and_cleanly() -> None:
    before = threading.active_count()
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        PostgresStore("postgresql://u:secret@127.0.0.1:1/db", connect_timeout=3)
    message = str(info.value)
    assert "127.0.0.1:1/db" in message and "secret" not in message
    assert time.monotonic() - started < 8
    time.sleep(0.2)
    assert threading.active_count() == before


def test_ping_after_close_raises_store_unavailable(pg_clean_dsn: str) -> None:
    store = PostgresStore(pg_clean_dsn)
    store.close()
    with pytest.raises(StoreUnavailableError):
        store.ping()


def _listen(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    for channel in ("conveyor_jobs", "conveyor_cancel", "conveyor_done"):
        conn.execute(f"LISTEN {channel}")
    return conn


def _drain(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in conn.notifies(timeout=0.3)]


def test_notifications(pg: PostgresStore, pg_clean_dsn: str) -> None:
    listener = _listen(pg_clean_dsn)
    try:
        jobs = pg.job_insert_many([new(), new(), new("q2")], T0)
        assert sorted(_drain(listener)) == [("conveyor_jobs", "default"), ("conveyor_jobs", "q2")]
        claimed = pg.job_claim(["default", "q2"], 3, "w", LEASE, at(1))
        assert _drain(listener) == []
        a, b, c = (Lease(j.id, j.lease_token or "") for j in claimed)
        pg.job_finish([Failure(a.id, a.token, "e", at(5))], at(2))
        assert _drain(listener) == [("conveyor_jobs", "default")]
        cancel_one(pg, b.id, at(3))
        assert _drain(listener) == [("conveyor_cancel", str(b.id))]
        pg.job_finish([Finish.complete(c.id, c.token, None)], at(4))
        done = _drain(listener)
        assert [ch for ch, _ in done] == ["conveyor_done"]
        assert str(c.id) in done[0][1].split(",")
        pg.job_finish(cancelled([b]), at(5))
        assert [ch for ch, _ in _drain(listener)] == ["conveyor_done"]
        # Snooze and release: back to queued (jobs), or ended by a pending cancel (done).
        pg.job_insert_many([new(run_at=at(30))], T0)
        _drain(listener)
        d, e = pg.job_claim(["default", "default"], 2, "w", LEASE, at(40))
        cancel_one(pg, e.id, at(41))
        _drain(listener)
        pg.job_finish([Finish.snooze(d.id, d.lease_token or "", at(50))], at(42))
        assert _drain(listener) == [("conveyor_jobs", "default")]
        pg.job_finish(released([Lease(e.id, e.lease_token or "")]), at(43))
        assert _drain(listener) == [("conveyor_done", str(e.id))]
        pg.job_rescue_expired(at(44))
        assert _drain(listener) == []
        # A rolled-back external enqueue sends nothing.
        with psycopg.connect(pg_clean_dsn) as conn:
            pg.job_insert_many([new("q3")], T0, connection=conn)
            conn.rollback()
        assert _drain(listener) == []
        del jobs
    finally:
        listener.close()


def test_external_transaction(pg: PostgresStore, pg_clean_dsn: str) -> None:
    [kept] = pg.job_insert_many([new(key="held", args=[1, {"x": 2}])], T0)
    with psycopg.connect(pg_clean_dsn) as conn:
        jobs = pg.job_insert_many([new(), new(key="held")], T0, connection=conn)
        assert jobs[1].id == kept.id
        assert jobs[1].args == [1, {"x": 2}]
        assert isinstance(jobs[1].args_json, str)
        # Not committed by the store: invisible to others until the caller commits.
        assert pg.job_get(jobs[0].id) is None
        conn.rollback()
    assert pg.job_get(jobs[0].id) is None
    with psycopg.connect(pg_clean_dsn, row_factory=psycopg.rows.dict_row) as conn:
        jobs = pg.job_insert_many([new(), new(key="held")], T0, connection=conn)
        assert jobs[1].id == kept.id
        conn.commit()
    assert pg.job_get(jobs[0].id) is not None
    assert [e.kind for e in pg.event_list(jobs[0].id)] == ["enqueued"]
    with pytest.raises(ConfigurationError):
        pg.job_insert_many([new()], T0, connection=object())


def test_claim_retries_after_losing_a_group_race(pg: PostgresStore, pg_clean_dsn: str) -> None:
    """A claimer that sees a group idle while another claim of it is uncommitted."""
    older, newer = pg.job_insert_many([new(group="g"), new(group="g")], T0)
    with psycopg.connect(pg_clean_dsn) as other:
        # Another claimer (with an older view of the group) is taking the newer job.
        other.execute(
            "UPDATE jobs SET state = 'running', lease_token = 'x' WHERE id = %s", (newer.id,)
        )
        result: list[list[Job]] = []
        thread = threading.Thread(
            target=lambda: result.append(pg.job_claim(["default"], 5, "w", LEASE, at(1)))
        )
        thread.start()
        time.sleep(0.5)  # the claim now waits on the unique index for `other`
        assert thread.is_alive()
        other.commit()
        thread.join(timeout=10)
    assert result == [[]]
    job = pg.job_get(older.id)
    assert job is not None and job.state == JobState.QUEUED and job.attempts == 0
    assert [e.kind for e in pg.event_list(older.id)] == ["enqueued"]


def test_many_claimers_never_share_a_job_or_a_group(
    pg_clean_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = 50
    total = 2000
    setup = PostgresStore(pg_clean_dsn, migrate=True)
    setup.job_insert_many([new(group=f"g{i % groups}") for i in range(total)], T0)
    setup.close()

    races = Counter[str]()
    real = PostgresStore._fetch_jobs

    def counting(self: PostgresStore, name: str, params: dict[str, Any]) -> list[Job]:
        try:
            return real(self, name, params)
        except psycopg.errors.UniqueViolation:
            races[name] += 1
            raise

    monkeypatch.setattr(PostgresStore, "_fetch_jobs", counting)

    lock = threading.Lock()
    running: set[str] = set()
    claimed: Counter[int] = Counter()
    order: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        store = PostgresStore(pg_clean_dsn, max_size=2)
        try:
            idle = 0
            while idle < 20:
                jobs = store.job_claim(["default"], 1, f"w{index}", LEASE, at(1))
                if not jobs:
                    idle += 1
                    time.sleep(0.002)
                    continue
                idle = 0
                [job] = jobs
                group = job.group or ""
                with lock:
                    assert group not in running, f"two running jobs in group {group}"
                    running.add(group)
                    claimed[job.id] += 1
                    order.setdefault(group, []).append(job.id)
                with lock:
                    running.discard(group)
                done = store.job_finish(
                    [Finish.complete(job.id, job.lease_token or "", None)], at(2)
                )
                assert done == [job.id]
        except BaseException as exc:
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    assert len(claimed) == total and set(claimed.values()) == {1}
    for ids in order.values():
        assert ids == sorted(ids), "a group ran out of order"
    check = PostgresStore(pg_clean_dsn)
    try:
        stats = check.stats(at(3))
        assert stats.queues["default"].counts == {"succeeded": total}
        events = check.event_since(0, 10 * total)
        assert Counter(e.kind for e in events if e.kind != "enqueued") == {"succeeded": total}
        # One enqueued event per enqueue statement, counting its jobs (migration 023).
        with psycopg.connect(pg_clean_dsn) as conn:
            counted = conn.execute(
                "SELECT sum(coalesce(jobs, 1)) FROM events WHERE kind = 'enqueued'"
            ).fetchone()
        assert counted is not None and counted[0] == total
    finally:
        check.close()
    print(f"group races retried: {races['job_claim']}")


# --- speed (informative) -------------------------------------------------------------
