"""Store queries behind the dashboard and /metrics, on every backend.

The clock is fixed (T0 plus offsets), as in the store contract tests.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from conveyor.job import EventKind, Job, JobState, NewJob, encode_payload
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from conveyor.store.selection import driven
from conveyor.store.sql import load_queries
from outcomes import Failure, listed
from store_fixtures import event_committed_late

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_job(
    task: str = "send",
    *,
    queue: str = "default",
    max_attempts: int = 1,
    key: str | None = None,
    batch: str | None = None,
) -> NewJob:
    args_json, kwargs_json = encode_payload([], {})
    return NewJob(
        queue=queue,
        task=task,
        args_json=args_json,
        kwargs_json=kwargs_json,
        run_at=T0,
        max_attempts=max_attempts,
        key=key,
        batch=batch,
    )


def claim_one(store: Store, queue: str, now: datetime) -> Job:
    (job,) = store.job_claim([queue], 1, "w1", LEASE, now)
    return job


def fail(store: Store, job: Job, error: str, now: datetime) -> None:
    assert store.job_finish([Failure(job.id, job.lease_token or "", error, now)], now) == [job.id]


def complete(store: Store, job: Job, now: datetime) -> None:
    assert store.job_finish([Finish.complete(job.id, job.lease_token or "", None)], now) == [job.id]


# --- listing: error text and the index-driven statements ------------------------------


def test_listing_filters_by_text_in_the_error(store: Store) -> None:
    jobs = store.job_insert_many(
        [new_job(queue="mail"), new_job(queue="mail"), new_job(queue="web", batch="b1")], T0
    )
    errors = {
        jobs[0].id: "Traceback ...\nTimeoutError: SMTP relay timed out",
        jobs[1].id: "KeyError: 'user'",
        jobs[2].id: "smtp said no",
    }
    for n, queue in enumerate(["mail", "mail", "web"]):
        job = claim_one(store, queue, at(1))
        fail(store, job, errors[job.id], at(2 + n))

    def ids(**filters: Any) -> list[int]:
        return [j.id for j in listed(store, **filters)]

    assert ids(error="SMTP") == [jobs[2].id, jobs[0].id]  # case-insensitive, newest first
    assert ids(error="smtp", state=JobState.FAILED, queue="mail") == [jobs[0].id]
    assert ids(error="smtp", queue="web") == [jobs[2].id]
    assert ids(error="smtp", batch="b1") == [jobs[2].id]
    assert ids(error="'user'", state=JobState.FAILED) == [jobs[1].id]
    assert ids(error="no such text") == []
    assert ids(error="") == ids()  # an empty search is no filter


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"state": JobState.QUEUED},
        {"state": JobState.SUCCEEDED, "queue": "b"},
        {"queue": "a"},
        {"queue": "a", "task": "t2"},
        {"batch": "x"},
        {"task": "t1"},
    ],
    ids=repr,
)
def test_listing_pages_cover_every_match_once(store: Store, filters: dict[str, Any]) -> None:
    store.job_insert_many(
        [
            new_job(f"t{n % 3}", queue="ab"[n % 2], batch="x" if n % 4 == 0 else None)
            for n in range(40)
        ],
        T0,
    )
    for job in store.job_claim(["b"], 8, "w1", LEASE, at(1)):
        complete(store, job, at(2))
    everything = listed(store, limit=1000)
    expected = [
        j.id
        for j in everything
        if all(getattr(j, name) == value for name, value in filters.items() if name != "state")
        and ("state" not in filters or j.state == filters["state"])
    ]
    assert expected, "the filter should match something"
    seen: list[int] = []
    before: int | None = None
    while True:
        page = listed(store, **filters, before_id=before, limit=7)
        seen += [j.id for j in page]
        if len(page) < 7:
            break
        before = page[-1].id
    assert seen == expected


def test_queue_names_of_jobs_and_pauses(store: Store) -> None:
    assert store.queue_names() == []
    store.job_insert_many([new_job(queue=q) for q in ["b", "a", "b", "c/d", "a"]], T0)
    store.queue_pause("paused-empty", T0)
    store.queue_pause("a", T0)
    assert store.queue_names() == ["a", "b", "c/d", "paused-empty"]


# --- throughput, event counts, run times ---------------------------------------------


def test_finished_per_slot_counts_by_queue_state_and_minute(store: Store) -> None:
    store.job_insert_many([new_job(queue="a")] * 3 + [new_job(queue="b")] * 2, T0)
    for queue, finish_at, ok in [("a", 30, True), ("a", 90, True), ("a", 95, False)]:
        job = claim_one(store, queue, at(1))
        if ok:
            complete(store, job, at(finish_at))
        else:
            fail(store, job, "boom", at(finish_at))
    job = claim_one(store, "b", at(1))
    complete(store, job, at(-30))  # before the window: not counted
    rows = store.stats_finished_per_slot(T0, timedelta(minutes=1))
    got = sorted((r.queue, r.state, r.slot, r.count) for r in rows)
    assert got == [("a", "failed", 1, 1), ("a", "succeeded", 0, 1), ("a", "succeeded", 1, 1)]


def test_event_counts_read_only_what_is_new(store: Store) -> None:
    assert store.event_offset() == (0, 0)
    store.job_insert_many([new_job(queue="a"), new_job(queue="b")], T0)
    first = store.event_count_by_kind((0, 0))
    assert first.counts == {("a", EventKind.ENQUEUED): 1, ("b", EventKind.ENQUEUED): 1}
    assert first.offset > (0, 0)
    assert store.event_count_by_kind(first.offset).counts == {}
    assert store.event_count_by_kind(first.offset).offset == first.offset
    assert store.event_offset() == first.offset

    job = claim_one(store, "a", at(1))
    fail(store, job, "boom", at(2))
    second = store.event_count_by_kind(first.offset)
    # A claim writes no event of its own: its start is on the event that ends it.
    assert second.counts == {("a", EventKind.FAILED): 1}
    assert second.offset > first.offset


def test_postgres_event_counts_include_an_event_committed_late(pg_clean_dsn: str) -> None:
    """A lower seq committed after a higher one was counted is counted later, once."""
    store = open_store(pg_clean_dsn)
    store.migrate()
    try:
        with event_committed_late(pg_clean_dsn) as (commit_early, _, _):
            # The lower seq's transaction is still open: nothing past it is counted yet.
            first = store.event_count_by_kind((0, 0))
            assert first.counts == {}
            commit_early()
        second = store.event_count_by_kind(first.offset)
        assert second.counts == {("q", EventKind.ENQUEUED): 2}
        assert store.event_count_by_kind(second.offset).counts == {}
        assert store.event_offset() == second.offset
    finally:
        store.close()


def test_run_time_histogram_buckets_the_last_attempt(store: Store) -> None:
    store.job_insert_many([new_job(queue="a")] * 3 + [new_job(queue="b")], T0)
    quick = claim_one(store, "a", at(10))
    complete(store, quick, at(10.25))  # 0.25 s
    slow = claim_one(store, "a", at(10))
    fail(store, slow, "boom", at(12))  # 2 s, failed for good: counted too
    claim_one(store, "a", at(10))  # still running: not counted
    other = claim_one(store, "b", at(10))
    complete(store, other, at(20))  # 10 s, above every bound

    bounds = [0.5, 1.0, 5.0]
    rows = store.job_run_time_histogram(at(0), at(30), bounds)
    got = sorted((r.queue, r.bucket, r.count, round(r.total_seconds, 6)) for r in rows)
    assert got == [("a", 0, 1, 0.25), ("a", 2, 1, 2.0), ("b", 3, 1, 10.0)]
    # The window is (after, until]: a job that ended exactly at `after` was counted before.
    assert store.job_run_time_histogram(at(12), at(30), bounds)[0].queue == "b"
    assert store.job_run_time_histogram(at(20), at(30), bounds) == []


# --- query plans ------------------------------------------------------------------------------

#: The statements that must walk an index, and the indexes each may use.
PLANNED = {
    "job_select/queue_state": ("jobs_queue_state",),
    "job_select/batch": ("jobs_batch",),
    "stats_finished_per_slot": ("jobs_finished",),
    "queue_names": ("jobs_queue_state",),
}
SQLITE_PLANNED = {
    **PLANNED,
    "stats_queued": ("jobs_queued",),  # from the index alone
}
PG_PLANNED = {
    **PLANNED,
    "stats_queued": ("jobs_queued",),
    "event_offset": ("events_xid",),  # backwards from the newest, not a sort of all
}
SQLITE_PARAMS: dict[str, Any] = {
    "state": "failed",
    "base_state": "failed",
    "queue": "q",
    "task": None,
    "group": None,
    "worker": None,
    "key": None,
    "limit_key": None,
    "args": None,
    "args_floor": 0,
    "batch": "b",
    "error": "timeout",
    "before_id": 2**63 - 1,
    "limit": 50,
    "since": 0.0,
    "slot": 60.0,
    "after_id": 0,
    "now": 0.0,
}


def test_sqlite_list_queries_walk_indexes(tmp_path: Any) -> None:
    from conveyor.store.dsn import open_store

    path = tmp_path / "plan.db"
    open_store(f"sqlite:///{path}").close()
    queries = load_queries("conveyor.store.sqlite")
    conn = sqlite3.connect(path)
    try:
        for name, indexes in SQLITE_PLANNED.items():
            sql = statement(queries, name)
            params = {**SQLITE_PARAMS, **alone(name)}
            params = {k: v for k, v in params.items() if f":{k}" in sql}
            plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
            assert any(re.search(rf"USING (COVERING )?INDEX {i}\b", plan) for i in indexes), (
                name,
                plan,
            )
            if name.startswith("job_select"):  # the index gives the order
                assert "USE TEMP B-TREE FOR ORDER BY" not in plan, (name, plan)
    finally:
        conn.close()


def test_postgres_list_queries_walk_indexes(pg_clean_dsn: str) -> None:
    from conveyor.store.dsn import open_store

    open_store(pg_clean_dsn).migrate()
    queries = load_queries("conveyor.store.postgres")
    with psycopg.connect(pg_clean_dsn, autocommit=True) as conn:
        # A day of work: mostly succeeded, one failure in a hundred, twenty queues,
        # finished over the last 17 hours; statistics as autovacuum would make them.
        conn.execute(
            """
            INSERT INTO jobs (id, queue, task, state, run_at, created_at, batch, finished_at,
                              error)
            SELECT n, 'q' || (n % 20), 't',
                   CASE WHEN n % 100 = 0 THEN 'failed' WHEN n % 10 = 1 THEN 'queued'
                        ELSE 'succeeded' END,
                   now(), now(), 'b' || (n % 500),
                   CASE WHEN n % 10 <> 1 THEN now() - make_interval(secs => n) END,
                   CASE WHEN n % 100 = 0 THEN 'boom ' || n END
            FROM generate_series(1, 60000) AS n
            """
        )
        conn.execute("ANALYZE jobs")
        # job_select plans for the values given (plan_for_values); the others run
        # with the store sessions' generic plans.
        recent = datetime.now(UTC) - timedelta(hours=1)
        values_of = {**SQLITE_PARAMS, "since": recent, "now": recent}
        for name, indexes in PG_PLANNED.items():
            mode = "force_custom_plan" if name.startswith("job_select") else "force_generic_plan"
            conn.execute(pgsql.SQL("SET plan_cache_mode = {}").format(pgsql.SQL(mode)))
            sql, names = positional(statement(queries, name))
            values = [{**values_of, **alone(name)}[n] for n in names]
            types = f"({', '.join(PG_TYPES[n] for n in names)})" if names else ""
            prepared = "p_" + name.replace("/", "_")
            conn.execute(f"PREPARE {prepared} {types} AS {sql}")
            args = pgsql.SQL(", ").join(map(pgsql.Literal, values))
            explain = pgsql.SQL("EXPLAIN EXECUTE {}{}").format(
                pgsql.Identifier(prepared), pgsql.SQL("({})").format(args) if values else args
            )
            rows = conn.execute(explain).fetchall()
            plan = " | ".join(r[0] for r in rows)
            assert any(re.search(rf"(using|Index Scan on) {i}\b", plan) for i in indexes), (
                name,
                plan,
            )
            if name == "job_select/queue_state":
                assert "Sort" not in plan, (name, plan)  # the index gives the order


def statement(queries: dict[str, str], name: str) -> str:
    """A named statement, or ``job_select/<driver>``: job_select as that driver drives it."""
    base, _, driver = name.partition("/")
    return driven(queries, base, driver) if driver else queries[base]


def alone(name: str) -> dict[str, Any]:
    """The filters a driven statement leaves unset: the driver's column filters alone."""
    if name == "job_select/queue_state":
        return {"batch": None}
    if name == "job_select/batch":
        return {"queue": None, "state": None}
    return {}


PG_TYPES = {
    "state": "text",
    "base_state": "text",
    "queue": "text",
    "task": "text",
    "group": "text",
    "worker": "text",
    "key": "text",
    "limit_key": "text",
    "args": "text",
    "args_floor": "bigint",
    "batch": "text",
    "error": "text",
    "before_id": "bigint",
    "limit": "bigint",
    "since": "timestamptz",
    "slot": "float8",
    "after_id": "bigint",
    "now": "timestamptz",
}


def positional(sql: str) -> tuple[str, list[str]]:
    """``%(name)s`` placeholders as ``$n`` for PREPARE, and the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), names
