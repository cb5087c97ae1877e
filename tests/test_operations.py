"""What an operator sees and does, through the App, on both databases.

Scheduled and retrying jobs told apart from ready ones; bulk actions by ids and
by filters; a group's jobs listed, counted, cancelled and taken back; a queue
deleted; purges narrowed by state and queue; retention by final state and by
count; the schema check; periodic ticks. Jobs move through the real store
calls (claim, fail, complete), as workers would move them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import conveyor.bulk
from conveyor import App, JobState
from conveyor.errors import (
    ConfigurationError,
    JobStateError,
    SchemaMissingError,
)
from conveyor.job import Job, NewJob, utcnow
from conveyor.store.dsn import open_store, require_existing
from conveyor.store.records import Finish
from outcomes import Failure, cancel_one, retry_one

LEASE = timedelta(seconds=30)


def claim(
    app: App, queue: str, n: int = 1, worker: str = "w1", group: str | None = None
) -> list[Job]:
    return app.store.job_claim([queue], n, worker, LEASE, utcnow(), group=group)


def fail(app: App, job: Job, retry_in: float, error: str = "boom") -> None:
    now = utcnow()
    failure = Failure(job.id, job.lease_token or "", error, now + timedelta(seconds=retry_in))
    assert app.store.job_finish([failure], now) == [job.id]


def complete(app: App, job: Job, at: datetime | None = None) -> None:
    done = app.store.job_finish(
        [Finish.complete(job.id, job.lease_token or "", None)], at or utcnow()
    )
    assert done == [job.id]


# --- every state visible ---------------------------------------------------------------


def test_ready_scheduled_and_retrying_are_told_apart(app: App) -> None:
    ready = app.enqueue("t", [1], queue="q")
    scheduled = app.enqueue("t", [2], queue="q", delay=3600)
    retrying = app.enqueue("t", [3], queue="q", max_attempts=3)
    # Claim the retrying one alone, and fail it with an hour of backoff.
    cancel_one(app.store, ready.id, utcnow())
    (held,) = claim(app, "q")
    assert held.id == retrying.id
    fail(app, held, 3600)
    retry_one(app.store, ready.id, utcnow())

    now = utcnow()
    assert app.get(ready.id).detailed_state(now) == "ready"
    assert app.get(scheduled.id).detailed_state(now) == "scheduled"
    assert app.get(retrying.id).detailed_state(now) == "retrying"
    # An hour later both are due: ready.
    assert app.get(retrying.id).detailed_state(now + timedelta(hours=2)) == "ready"

    q = app.stats().queues["q"]
    assert q.counts["queued"] == 3
    assert (q.ready, q.scheduled, q.retrying) == (1, 1, 1)
    assert app.stats().count("retrying") == 1 and app.stats().count("ready") == 1
    assert [j.id for j in app.jobs(state="retrying")] == [retrying.id]
    assert [j.id for j in app.jobs(state="scheduled", queue="q")] == [scheduled.id]
    assert [j.id for j in app.jobs(state="ready")] == [ready.id]
    assert len(app.jobs(state="queued")) == 3
    assert app.count_jobs(queue="q") == {"ready": 1, "scheduled": 1, "retrying": 1}


def test_run_now_makes_scheduled_and_retrying_jobs_due(app: App) -> None:
    later = [app.enqueue("t", [i], queue="q", delay=3600).id for i in range(3)]
    ready = app.enqueue("t", [9], queue="q").id
    assert app.run_jobs_now([later[0], ready]) == 1  # the ready one stays as it is
    assert app.get(later[0]).detailed_state() == "ready"
    assert [e.kind for e in app.events(later[0])] == ["enqueued", "run_now"]
    assert app.run_jobs_now(queue="q", state="scheduled") == 2
    assert app.count_jobs(queue="q") == {"ready": 4}


# --- bulk actions ---------------------------------------------------------------


@pytest.fixture
def failures(app: App) -> Iterator[list[int]]:
    """Five jobs of queue "mail" failed for good: three timeouts, two refusals."""
    ids = []
    for n in range(5):
        ids.append(app.enqueue("send", [n], queue="mail", max_attempts=1).id)
    for job in claim(app, "mail", 5):
        reason = "TimeoutError: relay slow" if job.args[0] < 3 else "ValueError: refused"
        fail(app, job, 0, reason)
    yield ids


def test_retry_by_filter_on_error_text_and_by_ids(app: App, failures: list[int]) -> None:
    assert app.count_jobs(state="failed", error="timeout") == {"failed": 3}
    assert app.retry_jobs(state="failed", error="timeout") == 3
    assert sorted(j.id for j in app.jobs(state="ready")) == failures[:3]
    assert all(app.get(i).attempts == 0 for i in failures[:3])
    # By ids: only the failed or cancelled ones go back.
    assert app.retry_jobs([failures[0], failures[3]]) == 1
    assert app.get(failures[3]).state == JobState.QUEUED
    assert [e.kind for e in app.events(failures[3])][-1] == "manual_retry"


def test_bulk_actions_walk_every_page(
    app: App, failures: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conveyor.bulk, "BULK_BATCH", 2)  # five jobs: three pages
    batches: list[int] = []
    assert app.retry_jobs(queue="mail", on_batch=batches.append) == 5
    assert batches == [2, 2, 1]
    assert app.cancel_jobs(queue="mail", state="queued") == 5
    assert app.count_jobs(queue="mail") == {"cancelled": 5}


def test_cancel_and_delete_leave_what_they_do_not_apply_to(app: App) -> None:
    queued = [app.enqueue("t", [i], queue="q").id for i in range(3)]
    (running,) = claim(app, "q")
    done = app.enqueue("t", [9], queue="other")
    (other,) = claim(app, "other")
    complete(app, other)

    assert running.id == queued[0]
    # Cancel: queued ones at once, the finished one untouched...
    assert app.cancel_jobs([*queued[1:], done.id]) == 2
    assert app.get(running.id).state == JobState.RUNNING
    # ...the running one asked to stop, once.
    assert app.cancel_jobs([running.id]) == 1
    assert app.get(running.id).cancel_requested
    assert app.cancel_jobs([running.id]) == 0
    assert app.get(done.id).state == JobState.SUCCEEDED

    # Delete: everything but the running job, with its events.
    assert app.delete_jobs(queue="q") == 2
    assert app.delete_jobs([done.id, running.id]) == 1
    assert [j.id for j in app.jobs(limit=10)] == [running.id]
    assert app.events(done.id) == []


def test_a_bulk_action_needs_ids_or_a_filter(app: App) -> None:
    app.enqueue("t", [])
    with pytest.raises(ConfigurationError, match="name the jobs"):
        app.delete_jobs()
    with pytest.raises(ConfigurationError, match="unknown state"):
        app.cancel_jobs(state="sleeping")
    with pytest.raises(ConfigurationError, match="unknown filter"):
        app.retry_jobs(colour="red")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="64-bit"):
        app.retry_jobs([2**64])
    assert len(app.jobs()) == 1


def test_bulk_retry_keeps_a_key_to_one_live_job(app: App) -> None:
    first = app.enqueue("t", [1], queue="q", key="k", max_attempts=1)
    (job,) = claim(app, "q")
    fail(app, job, 0)
    second = app.enqueue("t", [2], queue="q", key="k", max_attempts=1)
    assert second.id != first.id and not second.existing
    (job,) = claim(app, "q")
    fail(app, job, 0)
    # Two failed jobs of one key: only the newest goes back.
    assert app.retry_jobs([first.id, second.id]) == 1
    assert app.get(second.id).state == JobState.QUEUED
    assert app.get(first.id).state == JobState.FAILED


# --- groups ---------------------------------------------------------------


def test_a_groups_jobs_listed_counted_cancelled_and_taken_back(app: App) -> None:
    session = [app.enqueue("reply", [n], queue="chat", group="session-42").id for n in range(4)]
    others = app.enqueue("reply", [0], queue="chat", group="session-7").id
    (held,) = claim(app, "chat", group="session-42", worker="consumer-a")
    assert held.id == session[0]

    assert [j.id for j in app.jobs(group="session-42")] == session[::-1]
    assert [j.id for j in app.jobs(group="session-42", state="running")] == [held.id]
    assert app.count_jobs(group="session-42") == {"ready": 3, "running": 1}

    # Its pending jobs cancelled; its running one and the other group untouched.
    assert app.cancel_jobs(group="session-42", state="queued") == 3
    assert app.count_jobs(group="session-42") == {"running": 1, "cancelled": 3}
    assert app.get(others).state == JobState.QUEUED

    # The consumer died: take its job back now, without waiting for the lease.
    assert app.take_back(group="session-42") == 1
    back = app.get(held.id)
    assert back.state == JobState.QUEUED and back.detailed_state() == "ready"
    assert back.error == "worker lost: taken back by an operator"
    assert [e.kind for e in app.events(held.id)][-1] == "rescued"
    # The dead holder's late outcome is refused: its lease token is void.
    assert (
        app.store.job_finish([Finish.complete(held.id, held.lease_token or "", None)], utcnow())
        == []
    )
    # And by worker id, another consumer's job.
    (again,) = claim(app, "chat", group="session-42", worker="consumer-b")
    assert app.take_back(worker="consumer-b") == 1
    assert app.get(again.id).attempts == 2  # each run counted, as after a rescue


def test_take_back_fails_a_job_out_of_attempts(app: App) -> None:
    job = app.enqueue("t", [], queue="q", max_attempts=1)
    claim(app, "q")
    assert app.take_back([job.id]) == 1
    ended = app.get(job.id)
    assert ended.state == JobState.FAILED and ended.finished_at is not None
    assert [e.kind for e in app.events(job.id)][-2:] == ["rescued", "failed"]


# --- queues, purges, retention ------------------------------------------------------------------


def test_delete_a_queue(app: App) -> None:
    for n in range(3):
        app.enqueue("t", [n], queue="old")
    (running,) = claim(app, "old")
    app.pause("old")
    keep = app.enqueue("t", [], queue="kept").id
    with pytest.raises(JobStateError, match="1 running job"):
        app.delete_queue("old")
    complete(app, running)
    assert app.delete_queue("old") == 3
    assert "old" not in app.store.queue_names() and "old" not in app.stats().queues
    assert app.get(keep).state == JobState.QUEUED


def test_purge_by_state_and_queue_with_a_count_first(app: App) -> None:
    ended = utcnow() - timedelta(hours=2)
    for queue in ("a", "b"):
        app.enqueue("t", [1], queue=queue, max_attempts=1)
        app.enqueue("t", [2], queue=queue, max_attempts=1)
        ok, bad = sorted(claim(app, queue, 2), key=lambda j: j.id)
        complete(app, ok, ended)
        app.store.job_finish([Failure(bad.id, bad.lease_token or "", "x", ended)], ended)
    hour = timedelta(hours=1)
    assert app.purge_count(hour) == 4
    assert app.purge_count(hour, states=["failed"]) == 2
    assert app.purge_count(hour, states=["failed"], queue="a") == 1
    assert app.purge_count(timedelta(hours=3)) == 0
    assert app.purge(hour, states=["failed"], queue="a") == 1
    assert app.count_jobs(state="failed") == {"failed": 1}
    assert app.purge(hour, states=["succeeded"]) == 2
    assert app.count_jobs() == {"failed": 1}
    with pytest.raises(ConfigurationError, match="only finished jobs"):
        app.purge(hour, states=["queued"])


def test_retention_by_final_state_and_by_count(dsn: str) -> None:
    with App(
        dsn,
        retention=timedelta(days=1),
        retention_by_state={"failed": timedelta(days=30)},
        keep_finished={"q": 2},
    ) as app:
        app.migrate()
        two_days_ago = utcnow() - timedelta(days=2)
        ids = [app.enqueue("t", [n], queue="q", max_attempts=1).id for n in range(6)]
        jobs = sorted(claim(app, "q", 6), key=lambda j: j.id)
        for job in jobs[:3]:
            complete(app, job, two_days_ago)
        for job in jobs[3:5]:
            app.store.job_finish(
                [Failure(job.id, job.lease_token or "", "x", two_days_ago)], two_days_ago
            )
        complete(app, jobs[5])  # just now
        # Succeeded two days ago: past the day of retention. Failed two days ago:
        # within its own 30 days, but the queue keeps only its 2 newest finished jobs.
        assert app.apply_retention(utcnow()) == 3 + 1
        assert [j.id for j in app.jobs(limit=10)] == [ids[5], ids[4]]
        # The count rule runs at most once a minute; the age rules every round.
        app.enqueue("t", [7], queue="q", max_attempts=1)
        (late,) = claim(app, "q")
        complete(app, late)
        assert app.apply_retention(utcnow()) == 0
    with pytest.raises(ConfigurationError, match="only finished jobs"):
        App(dsn, retention_by_state={"running": timedelta(days=1)})
    with pytest.raises(ConfigurationError, match="keep_finished"):
        App(dsn, keep_finished=-1)


# --- enqueue with a held key ---------------------------------------------------------------


def test_enqueue_tells_when_a_live_job_holds_the_key(app: App) -> None:
    first = app.enqueue("t", [1], key="k")
    assert not first.existing
    again = app.enqueue("t", [2], key="k")
    assert again.existing and again.id == first.id
    assert not app.get(first.id).existing


# --- no silent empty databases, and the schema check ----------------------------------------------


def test_check_schema_on_a_database_without_conveyors_tables(
    pg_clean_dsn: str, tmp_path: Path
) -> None:
    with App(pg_clean_dsn) as app:  # PostgreSQL is never migrated implicitly
        with pytest.raises(SchemaMissingError, match="run `conveyor migrate`"):
            app.check_schema()
        health = app.health()
        assert health["ok"] is False and "conveyor migrate" in health["error"]
        app.migrate()
        assert app.check_schema() == app.store.schema_latest()
        assert app.health()["ok"] is True
    bare = open_store(f"sqlite:///{tmp_path / 'bare.db'}", migrate=False)
    try:
        with App(store=bare) as app, pytest.raises(SchemaMissingError, match="no conveyor tables"):
            app.check_schema()
    finally:
        bare.close()


def test_an_empty_dsn_and_a_missing_sqlite_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="the DSN is empty"):
        App("")
    with pytest.raises(ConfigurationError, match="the DSN is empty"):
        App("   ")
    missing = tmp_path / "typo.db"
    with pytest.raises(ConfigurationError, match=f"no database at {missing}"):
        require_existing(f"sqlite:///{missing}")
    assert not missing.exists()
    require_existing("postgresql://localhost/x")  # nothing to check: never created by conveyor


# --- periodic ticks ---------------------------------------------------------------------


def test_periodic_ticks_keep_the_newest(app: App) -> None:
    early = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    late = early + timedelta(minutes=5)

    def tick(task: str, at: datetime) -> bool:
        job = NewJob("default", task, "[]", "{}", at)
        return app.store.periodic_enqueue(task, at, job, at)

    assert app.store.periodic_last_ticks() == {}
    assert tick("report", late)
    assert not tick("report", early)  # a slower leader's older tick
    assert not tick("report", late)  # and the same tick again
    assert tick("cleanup", early)
    assert app.store.periodic_last_ticks() == {"report": late, "cleanup": early}
    assert sorted(j.task for j in app.jobs()) == ["cleanup", "report"]


def test_async_twins_of_the_bulk_actions(app: App) -> None:
    import asyncio

    ids = [app.enqueue("t", [n], queue="q", delay=600).id for n in range(2)]

    async def main() -> tuple[dict[str, int], int, int]:
        counts = await app.acount_jobs(queue="q")
        ran = await app.arun_jobs_now(ids[:1])
        cancelled = await app.acancel_jobs(queue="q", state="scheduled")
        return counts, ran, cancelled

    assert asyncio.run(main()) == ({"scheduled": 2}, 1, 1)
    assert app.count_jobs(queue="q") == {"ready": 1, "cancelled": 1}
