"""Jobs that wait for other jobs (``after=``), on every store.

Each test builds a small graph with the public API, runs it with ``drain`` or
drives the store by hand (claims and finishes at fixed moments), and checks
states, results, errors and the history the store recorded.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conveyor import App, Context, InvalidJobError, JobState
from conveyor.errors import JobStateError
from conveyor.job import EventKind, NewJob
from conveyor.store.records import Finish, Purge
from conveyor.testing import drain

T0 = datetime(2031, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def tasks(app: App) -> dict[str, Any]:
    """A few handlers: each records the upstream it saw."""
    seen: dict[int, dict[int, Any]] = {}

    @app.task()
    def value(x: int) -> int:
        return x

    @app.task()
    def total(ctx: Context) -> int:
        seen[ctx.job_id] = dict(ctx.upstream)
        return sum(ctx.upstream.values())

    @app.task(max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    @app.task()
    def report(ctx: Context) -> dict[str, Any]:
        seen[ctx.job_id] = dict(ctx.upstream)
        return {"ok": sorted(ctx.upstream), "errors": sorted(ctx.upstream_errors)}

    return {"value": value, "total": total, "boom": boom, "report": report, "seen": seen}


def kinds(app: App, job_id: int) -> list[str]:
    return [e.kind for e in app.events(job_id)]


def test_a_diamond_runs_its_join_once_with_both_results(app: App) -> None:
    t = tasks(app)
    a = t["value"].enqueue(1)
    b = t["total"].options(after=[a]).enqueue()
    c = t["total"].options(after=[a.id]).enqueue()
    d = t["total"].options(after=[b, c]).enqueue()
    assert [j.state for j in (b, c, d)] == [JobState.WAITING] * 3
    assert app.stats().count("waiting") == 3

    assert drain(app) == {"succeeded": 4}

    assert app.get(d.id).result == 2
    assert t["seen"][d.id] == {b.id: 1, c.id: 1}
    assert t["seen"][b.id] == {a.id: 1}
    assert kinds(app, d.id) == ["enqueued", "ready", "claimed", "succeeded"]
    assert [p.id for p in app.parents(d.id)] == [b.id, c.id]
    assert [c_.id for c_ in app.children(a.id)] == [b.id, c.id]


def test_a_chain_passes_each_result_on(app: App) -> None:
    t = tasks(app)
    job = t["value"].enqueue(5)
    chain = [job]
    for _ in range(4):
        chain.append(t["total"].options(after=[chain[-1]]).enqueue())
    # Only the head is claimable: a drain that takes one job at a time still
    # runs them in order, each readied by the finish of the one before.
    assert drain(app) == {"succeeded": 5}
    assert [app.get(j.id).result for j in chain] == [5, 5, 5, 5, 5]
    runs = [app.events(j.id)[-1].seq for j in chain]
    assert runs == sorted(runs)


def test_a_fan_in_waits_for_every_parent(app: App) -> None:
    t = tasks(app)
    parents = t["value"].enqueue_many([((n,), {}) for n in range(50)])
    child = t["total"].options(after=parents).enqueue()
    store = app.store
    claimed = store.job_claim(["default"], 49, "w", LEASE, T0)
    assert len(claimed) == 49 and child.id not in {j.id for j in claimed}
    store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed], T0)
    assert app.get(child.id).state == JobState.WAITING
    assert drain(app) == {"succeeded": 2}
    assert app.get(child.id).result == 49 + 49  # 49 ones, then the last parent's 49


def test_claims_never_take_a_waiting_job(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    t["total"].options(after=[a]).enqueue()
    assert app.store.job_claim(["default"], 10, "w", LEASE) == []
    # The only job due is the delayed parent, an hour from now.
    assert 3000 < (app.store.next_run_in(["default"]) or 0) <= 3600


def test_a_failure_cancels_the_children_and_theirs_in_turn(app: App) -> None:
    t = tasks(app)
    a = t["boom"].enqueue()
    ok = t["value"].enqueue(1)
    b = t["total"].options(after=[a, ok]).enqueue()
    c = t["total"].options(after=[b]).enqueue()

    assert drain(app) == {"failed": 1, "succeeded": 1}

    b_now, c_now = app.get(b.id), app.get(c.id)
    assert b_now.state == c_now.state == JobState.CANCELLED
    assert b_now.error == f"job {a.id}, which this job waits for, failed"
    assert c_now.error == f"job {b.id}, which this job waits for, was cancelled"
    assert kinds(app, c.id) == ["enqueued", "cancelled"]
    assert app.events(c.id)[-1].error == c_now.error
    assert app.stats().count("waiting") == 0


def test_cancelling_a_parent_cancels_the_waiting_children(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    b = t["total"].options(after=[a]).enqueue()
    c = t["total"].options(after=[b]).enqueue()

    app.cancel(a.id)

    assert app.get(b.id).error == f"job {a.id}, which this job waits for, was cancelled"
    assert app.get(c.id).state == JobState.CANCELLED


def test_cancelling_a_waiting_job_cancels_it_and_its_children(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    b = t["total"].options(after=[a]).enqueue()
    c = t["total"].options(after=[b]).enqueue()

    assert app.cancel(b.id).state == JobState.CANCELLED

    assert app.get(c.id).state == JobState.CANCELLED
    assert app.get(a.id).state == JobState.QUEUED
    assert kinds(app, b.id) == ["enqueued", "cancelled"]


def test_after_failure_run_runs_the_child_without_the_failed_parent(app: App) -> None:
    t = tasks(app)
    a = t["boom"].enqueue()
    ok = t["value"].enqueue(7)
    child = t["report"].options(after=[a, ok], after_failure="run").enqueue()

    assert drain(app) == {"failed": 1, "succeeded": 2}

    assert app.get(child.id).result == {"ok": [ok.id], "errors": [a.id]}
    assert t["seen"][child.id] == {ok.id: 7}


def test_a_retried_parent_keeps_its_children_waiting(app: App) -> None:
    tries: list[int] = []

    @app.task(max_attempts=3)
    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("first try fails")
        return "done"

    t = tasks(app)
    a = flaky.enqueue()
    child = t["report"].options(after=[a]).enqueue()

    assert drain(app) == {"retried": 1}
    assert app.get(child.id).state == JobState.WAITING

    assert drain(app, with_scheduled=True) == {"succeeded": 2}
    assert app.get(child.id).result == {"ok": [a.id], "errors": []}


def test_a_rescued_parent_keeps_its_children_waiting(app: App) -> None:
    t = tasks(app)
    a = t["value"].enqueue(1)
    child = t["total"].options(after=[a]).enqueue()
    store = app.store
    (claimed,) = store.job_claim(["default"], 1, "w", LEASE, T0)
    assert claimed.id == a.id

    assert store.job_rescue_expired(T0 + 2 * LEASE) == [a.id]

    assert app.get(a.id).state == JobState.QUEUED
    assert app.get(child.id).state == JobState.WAITING
    assert drain(app, with_scheduled=True) == {"succeeded": 2}  # rescued at T0, a future moment


def test_a_rescued_parent_out_of_attempts_cancels_its_children(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(max_attempts=1).enqueue(1)
    child = t["total"].options(after=[a]).enqueue()
    store = app.store
    store.job_claim(["default"], 1, "w", LEASE, T0)

    store.job_rescue_expired(T0 + 2 * LEASE)

    assert app.get(a.id).state == JobState.FAILED
    assert app.get(child.id).error == f"job {a.id}, which this job waits for, failed"


def test_an_unknown_parent_is_refused_and_nothing_is_written(app: App) -> None:
    t = tasks(app)
    a = t["value"].enqueue(1)
    with pytest.raises(InvalidJobError, match=r"after names job 999999, which does not exist"):
        t["total"].options(after=[a, 999_999]).enqueue_many([((), {}), ((), {})])
    assert [j.id for j in app.jobs()] == [a.id]
    with pytest.raises(InvalidJobError, match="after must name Jobs or job ids"):
        t["total"].options(after=["x"]).enqueue()
    with pytest.raises(InvalidJobError, match="after_failure must be 'cancel' or 'run'"):
        t["total"].options(after_failure="skip").enqueue()


def test_a_job_cannot_wait_for_itself_or_a_job_enqueued_after_it(app: App) -> None:
    # Ids are handed out in order: the next job's id is known before it is
    # enqueued. An edge onto it (or a later one) would be a cycle that waits forever.
    t = tasks(app)
    a = t["value"].enqueue(1)
    with pytest.raises(InvalidJobError, match=rf"after names job {a.id + 1}, which does not"):
        t["total"].options(after=[a.id + 1]).enqueue()
    assert [j.id for j in app.jobs()] == [a.id]

    b = t["value"].enqueue(2)
    # The first job would wait for the second and the second for itself.
    with pytest.raises(InvalidJobError, match=r"which does not exist"):
        t["total"].options(after=[b.id + 2]).enqueue_many([((), {}), ((), {})])
    assert sorted(j.id for j in app.jobs()) == [a.id, b.id]
    assert edge_rows(app) == 0


def test_two_jobs_of_one_insert_cannot_name_each_others_ids(app: App) -> None:
    tasks(app)
    a = app.store.job_insert_many([_node("value")], datetime.now(UTC))[0]
    with pytest.raises(InvalidJobError, match=r"which does not exist"):
        app.store.job_insert_many(
            [_node("total", after=(a.id + 2,)), _node("total", after=(a.id + 1,))],
            datetime.now(UTC),
        )
    assert [j.id for j in app.jobs()] == [a.id]
    assert edge_rows(app) == 0
    assert drain(app) == {"succeeded": 1}


def _node(task: str, after: tuple[int, ...] = ()) -> NewJob:
    args = "[1]" if task == "value" else "[]"
    return NewJob("default", task, args, "{}", datetime.now(UTC), after=after)


def test_an_edge_onto_an_ended_job_is_resolved_at_once(app: App) -> None:
    t = tasks(app)
    done = t["value"].enqueue(3)
    failed = t["boom"].enqueue()
    drain(app)

    ready = t["total"].options(after=[done]).enqueue()
    lost = t["total"].options(after=[done, failed]).enqueue()
    anyway = t["report"].options(after=[failed], after_failure="run").enqueue()

    assert ready.state == JobState.QUEUED
    assert lost.state == JobState.CANCELLED
    assert lost.error == f"job {failed.id}, which this job waits for, failed"
    assert app.get(lost.id).error == lost.error
    assert anyway.state == JobState.QUEUED
    assert drain(app) == {"succeeded": 2}
    assert app.get(ready.id).result == 3
    assert [r.resolved for r in app.store.job_parents(lost.id)] == ["succeeded", "failed"]  # type: ignore[attr-defined]


def test_a_parent_given_by_key_is_the_existing_job(app: App) -> None:
    t = tasks(app)
    first = t["value"].options(key="nightly").enqueue(4)
    again = t["value"].options(key="nightly").enqueue(5)
    assert again.existing and again.id == first.id

    child = t["total"].options(after=[again]).enqueue()

    assert drain(app) == {"succeeded": 2}
    assert app.get(child.id).result == 4
    assert [p.id for p in app.parents(child.id)] == [first.id]


def test_a_waiting_job_holds_its_key(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    child = t["total"].options(after=[a], key="k").enqueue()
    again = t["total"].options(key="k").enqueue()
    assert again.existing and again.id == child.id
    assert again.state == JobState.WAITING


def test_a_waiting_job_in_a_group_lets_the_group_run(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    t["total"].options(after=[a], group="g").enqueue()
    other = t["value"].options(group="g").enqueue(2)
    assert drain(app) == {"succeeded": 1}
    assert app.get(other.id).state == JobState.SUCCEEDED


def test_a_batch_with_waiting_jobs_is_not_finished(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    t["total"].options(after=[a], batch="b").enqueue()
    status = app.batch_status("b")
    assert (status.waiting, status.outstanding, status.finished) == (1, 1, False)


def test_many_workers_finishing_the_parents_at_once_ready_the_child_once(app: App) -> None:
    t = tasks(app)
    parents = t["value"].enqueue_many([((n,), {}) for n in range(24)])
    child = t["total"].options(after=parents).enqueue()
    store = app.store
    claimed = [store.job_claim(["default"], 1, f"w{n}", LEASE, T0)[0] for n in range(24)]
    start = threading.Barrier(len(claimed))
    errors: list[BaseException] = []

    def finish(job: Any) -> None:
        try:
            start.wait()
            store.job_finish([Finish.complete(job.id, job.lease_token, "1")], T0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(j,)) for j in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []

    assert app.get(child.id).state == JobState.QUEUED
    assert kinds(app, child.id).count(EventKind.READY) == 1
    assert drain(app) == {"succeeded": 1}
    assert app.get(child.id).result == 24


def test_retention_keeps_a_parent_whose_children_still_wait(app: App) -> None:
    t = tasks(app)
    done = t["value"].enqueue(1)
    drain(app)
    later = t["value"].options(delay=3600).enqueue(2)
    child = t["total"].options(after=[done, later]).enqueue()
    future = datetime.now(UTC) + timedelta(days=1)

    assert app.store.job_purge_where(Purge(future, FINAL)) == 0
    assert app.store.job_purge_beyond("default", 0, FINAL) == 0  # by count, too
    assert app.get(done.id).state == JobState.SUCCEEDED

    app.cancel(later.id)
    assert app.get(child.id).state == JobState.CANCELLED
    assert edge_rows(app) == 2
    assert app.store.job_purge_where(Purge(future, FINAL)) == 3
    assert app.jobs() == []
    assert edge_rows(app) == 0  # the edges went with their jobs


def test_a_waiting_job_cannot_be_held_until_it_is_queued(app: App) -> None:
    t = tasks(app)
    later = t["value"].options(delay=3600).enqueue(1)
    child = t["total"].options(after=[later]).enqueue()
    with pytest.raises(JobStateError, match="waiting: only a queued job can be held; hold it once"):
        app.hold(child.id)
    assert app.hold_jobs([child.id]) == 0
    assert app.get(child.id).state == JobState.WAITING and not app.get(child.id).held
    drain(app, with_scheduled=True)
    assert app.get(child.id).state == JobState.SUCCEEDED


#: Every final state: what a purge of all finished jobs names.
FINAL = ("succeeded", "failed", "cancelled")


def edge_rows(app: App) -> int:
    """Edges the store holds, counted behind its back (rows, or Redis's wp: fields)."""
    store: Any = app.store
    if hasattr(store, "_client"):  # Redis
        client = store._client
        return sum(client.hlen(k) for k in client.scan_iter(match=f"{store.prefix}wp:*"))
    with store._conn() as conn:
        return int(conn.execute("SELECT count(*) FROM job_edges").fetchone()[0])


def test_a_graph_inserted_at_once_links_by_position(app: App) -> None:
    def node(task: str, after_new: tuple[int, ...] = ()) -> NewJob:
        now = datetime.now(UTC)
        return NewJob("default", task, "[1]" if task == "value" else "[]", "{}", now,
                      after_new=after_new)  # fmt: skip

    tasks(app)
    jobs = app.store.job_insert_many(
        [node("value"), node("total", (0,)), node("total", (0,)), node("total", (1, 2))],
        datetime.now(UTC),
    )
    assert [j.state for j in jobs] == ["queued", "waiting", "waiting", "waiting"]
    assert drain(app) == {"succeeded": 4}
    assert app.get(jobs[3].id).result == 2
    with pytest.raises(InvalidJobError, match="can only wait for jobs before it"):
        app.store.job_insert_many([node("total", (0,))], datetime.now(UTC))


def test_a_readied_job_keeps_its_priority(app: App) -> None:
    t = tasks(app)
    a = t["value"].enqueue(1)
    urgent = t["total"].options(after=[a], priority=10).enqueue()
    store = app.store
    (parent,) = store.job_claim(["default"], 1, "w", LEASE, T0)
    older = t["value"].enqueue(2)  # queued before the child is ready, at a lower priority
    store.job_finish([Finish.complete(parent.id, parent.lease_token or "", "1")], T0)
    (first,) = store.job_claim(["default"], 1, "w", LEASE, T0)
    assert first.id == urgent.id and older.id > a.id


def test_limits_apply_once_a_job_is_ready(app: App) -> None:
    t = tasks(app)
    app.limit("default", concurrency=1)
    parents = t["value"].enqueue_many([((n,), {}) for n in range(3)])
    child = t["total"].options(after=parents).enqueue()
    store = app.store
    (first,) = store.job_claim(["default"], 10, "w", LEASE)  # the limit lets one through
    assert store.job_claim(["default"], 10, "w", LEASE) == []
    store.job_finish([Finish.complete(first.id, first.lease_token or "", "0")])
    assert drain(app) == {"succeeded": 3}  # the two other parents, then the child
    assert app.get(child.id).result == 0 + 1 + 2


def test_a_parent_that_times_out_cancels_its_children(app: App) -> None:
    import asyncio

    @app.task(timeout=0.2, max_attempts=1)
    async def slow() -> None:
        await asyncio.sleep(5)

    t = tasks(app)
    a = slow.enqueue()
    child = t["total"].options(after=[a]).enqueue()
    assert app.run_worker(burst=True, concurrency=2, lease=5) == 0
    assert "TimeoutError" in (app.get(a.id).error or "")
    assert app.get(child.id).error == f"job {a.id}, which this job waits for, failed"


def test_consume_hands_out_a_child_once_its_parents_are_done(app: App) -> None:
    t = tasks(app)
    a = t["value"].enqueue(4)
    b = t["value"].enqueue(5)
    child = t["total"].options(after=[a, b]).enqueue()
    seen = []
    for job in app.consume(["default"], poll_interval=0.05, idle_timeout=0.5):
        seen.append(job.job.id)
        if job.job.id == child.id:
            job.complete(sum(job.upstream.values()))
        else:
            job.complete(job.job.args[0])
    assert seen == [a.id, b.id, child.id]
    assert app.get(child.id).result == 9


def test_deleting_a_parent_before_it_ended_lets_its_children_go_on(app: App) -> None:
    t = tasks(app)
    a = t["value"].options(delay=3600).enqueue(1)
    ok = t["value"].enqueue(2)
    child = t["total"].options(after=[a, ok]).enqueue()
    grandchild = t["total"].options(after=[child]).enqueue()
    anyway = t["report"].options(after=[a, ok], after_failure="run").enqueue()

    assert app.delete_jobs(ids=[a.id]) == 1

    assert app.get(child.id).error == f"job {a.id}, which this job waits for, was deleted"
    assert app.get(grandchild.id).state == JobState.CANCELLED
    assert app.get(anyway.id).state == JobState.WAITING  # still waits for ok
    assert drain(app) == {"succeeded": 2}
    # The deleted parent is named among its errors, not silently left out.
    assert app.get(anyway.id).result == {"ok": [ok.id], "errors": [a.id]}


def test_a_deleted_parent_is_named_in_upstream_errors_not_left_out(app: App) -> None:
    t = tasks(app)
    seen: dict[str, Any] = {}

    @app.task()
    def join(ctx: Context) -> None:
        seen.update(upstream=dict(ctx.upstream), errors=dict(ctx.upstream_errors),
                    parents=[p.id for p in ctx.parents])  # fmt: skip

    done = t["value"].enqueue(1)
    later = t["value"].options(delay=3600).enqueue(2)
    child = join.options(after=[done, later]).enqueue()
    assert drain(app) == {"succeeded": 1}
    assert app.delete_jobs(ids=[done.id]) == 1  # it had succeeded: the child still waits

    (running,) = app.store.job_claim(["default"], 1, "w", LEASE, T0 + timedelta(days=1))
    app.store.job_finish([Finish.complete(running.id, running.lease_token or "", "2")])
    assert drain(app) == {"succeeded": 1}

    gone = f"job {done.id}, which this job waits for, was deleted"
    assert seen == {"upstream": {later.id: 2}, "errors": {done.id: gone},
                    "parents": [later.id]}  # fmt: skip
    assert [(r.id, r.job is None, r.resolved) for r in app.parent_edges(child.id)] == [
        (done.id, True, "deleted"),
        (later.id, False, "succeeded"),
    ]
    assert [p.id for p in app.parents(child.id)] == [later.id]
