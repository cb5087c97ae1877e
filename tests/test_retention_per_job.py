"""Retention per task and per job (``retain=``): a finished job is kept as long as
its own rule says for the state it ended in, whatever its queue's policy.

On every store: the rule is stored with the job, the round
(``job_purge_retained``, run by maintenance) deletes exactly the jobs past it
and no others, the queue's age rules pass over those jobs while an operator's
purge still takes them, and a task's default gives way to an enqueue's.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from conveyor import App, InvalidJobError
from conveyor.cli import cli
from conveyor.errors import ConfigurationError
from conveyor.job import JobState, NewJob
from conveyor.retain import describe_retain, read_retain, resolve_retain
from conveyor.store.protocols import OperatorStore, Store
from conveyor.store.records import Finish, Purge
from conveyor.store.retaining import RetainingStore
from conveyor.testing import drain
from conveyor.web import create_app
from conveyor.worker.maintenance import Maintenance
from conveyor.worker.retention import Housekeeping, Retention

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
HOUR = timedelta(hours=1)


def new(retain: object = None) -> NewJob:
    return NewJob("q", "t", "[]", "{}", run_at=NOW, retain=resolve_retain(retain))


def retaining(store: Store) -> RetainingStore:
    assert isinstance(store, RetainingStore)
    return store


def operator(store: Store) -> OperatorStore:
    assert isinstance(store, OperatorStore)
    return store


def finish_all(store: Store, kinds: list[str], at: datetime) -> None:
    """Claim every queued job of q (oldest first) and end each as ``kinds`` says."""
    leases = sorted(store.job_claim(["q"], len(kinds), "w", LEASE, at), key=lambda j: j.id)
    assert len(leases) == len(kinds)
    finishes = [
        Finish(j.id, j.lease_token or "", kind, "1" if kind == "complete" else None, "boom")  # type: ignore[arg-type]
        for j, kind in zip(leases, kinds, strict=True)
    ]
    store.job_finish(finishes, at)


def alive(store: Store, *ids: int) -> list[int]:
    return [i for i in ids if store.job_get(i) is not None]


def test_the_rule_is_stored_only_for_jobs_that_have_one(store: Store) -> None:
    one, each, plain = store.job_insert_many(
        [new(HOUR), new({"failed": timedelta(days=30), "succeeded": 0}), new()], NOW
    )
    rules = retaining(store).job_retain([one.id, each.id, plain.id])
    assert set(rules) == {one.id, each.id}
    assert read_retain(rules[one.id]) == dict.fromkeys(("cancelled", "failed", "succeeded"), HOUR)
    assert read_retain(rules[each.id]) == {"failed": timedelta(days=30), "succeeded": timedelta(0)}


def test_the_round_deletes_exactly_the_jobs_past_their_own_rule(store: Store) -> None:
    jobs = store.job_insert_many(
        [
            new({"succeeded": 0}),  # goes at once
            new({"succeeded": 60}),  # goes after a minute
            new({"failed": 60}),  # succeeded: no rule of its own for that state
            new({"failed": 3600}),  # failed: kept an hour
            new(),  # the queue's policy alone
        ],
        NOW,
    )
    gone_at_once, minute, other_state, failed_hour, plain = (j.id for j in jobs)
    finish_all(store, ["complete", "complete", "complete", "fail", "complete"], NOW)
    everyone = (gone_at_once, minute, other_state, failed_hour, plain)
    assert retaining(store).job_purge_retained(NOW) == 1
    assert alive(store, *everyone) == [minute, other_state, failed_hour, plain]
    assert retaining(store).job_purge_retained(NOW + timedelta(seconds=59)) == 0
    assert retaining(store).job_purge_retained(NOW + timedelta(seconds=61)) == 1
    assert retaining(store).job_purge_retained(NOW + timedelta(hours=2)) == 1
    assert alive(store, *everyone) == [other_state, plain]
    assert store.event_list(failed_hour) == []  # its events went with it
    assert retaining(store).job_purge_retained(NOW + timedelta(days=365)) == 0


def test_live_jobs_are_never_deleted_by_their_rule(store: Store) -> None:
    queued, running = store.job_insert_many([new(0), new(0)], NOW)
    store.job_claim(["q"], 1, "w", LEASE, NOW)
    assert retaining(store).job_purge_retained(NOW + timedelta(days=1)) == 0
    assert alive(store, queued.id, running.id) == [queued.id, running.id]


def test_a_job_retried_after_it_failed_is_kept_until_it_ends_again(store: Store) -> None:
    (job,) = store.job_insert_many([new({"failed": 0})], NOW)
    finish_all(store, ["fail"], NOW)
    assert operator(store).job_retry_many([job.id], NOW) == [job.id]
    assert retaining(store).job_purge_retained(NOW + HOUR) == 0
    assert store.job_get(job.id) is not None
    finish_all(store, ["fail"], NOW + HOUR)
    assert retaining(store).job_purge_retained(NOW + HOUR) == 1
    assert store.job_get(job.id) is None


def test_the_queue_age_rules_pass_over_jobs_with_their_own_rule(store: Store) -> None:
    jobs = store.job_insert_many(
        [new({"succeeded": timedelta(days=30)}), new({"failed": 60}), new(), new()], NOW
    )
    kept_long, other_state, plain, plain2 = (j.id for j in jobs)
    finish_all(store, ["complete"] * 4, NOW)
    policy = Retention(age=HOUR)
    assert policy.apply(operator(store), NOW + timedelta(hours=2)) == 3
    assert alive(store, kept_long, other_state, plain, plain2) == [kept_long]
    # An operator's purge takes every job it names, own rule or not.
    purge = Purge(NOW + timedelta(hours=2), ["succeeded"])
    assert operator(store).job_purge_where(purge) == 1
    assert store.job_get(kept_long) is None


def test_by_state_age_rules_pass_over_them_too(store: Store) -> None:
    jobs = store.job_insert_many([new({"failed": timedelta(days=30)}), new()], NOW)
    finish_all(store, ["fail", "fail"], NOW)
    policy = Retention(by_state={"failed": HOUR})
    assert policy.apply(operator(store), NOW + timedelta(hours=2)) == 1
    assert alive(store, jobs[0].id, jobs[1].id) == [jobs[0].id]


def test_task_default_enqueue_override_and_the_maintenance_round(app: App) -> None:
    @app.task(queue="q", retain={"succeeded": 0})
    def work() -> None: ...

    default = work.enqueue()
    mine = work.options(retain=timedelta(days=1)).enqueue()
    by_name = app.enqueue("work", retain={"failed": 5})
    rules = retaining(app.store).job_retain([default.id, mine.id, by_name.id])
    assert json.loads(rules[default.id]) == {"succeeded": 0.0}
    assert json.loads(rules[mine.id])["succeeded"] == 86400.0
    assert json.loads(rules[by_name.id]) == {"failed": 5.0}
    drain(app, queues=["q"])
    Maintenance(app.runtime, "leader", lease=5).run_once()
    assert alive(app.store, default.id, mine.id, by_name.id) == [mine.id, by_name.id]
    assert app.get(by_name.id).state is JobState.SUCCEEDED
    assert app.apply_retention(datetime.now(UTC) + timedelta(days=2)) == 1
    assert alive(app.store, mine.id, by_name.id) == [by_name.id]


def test_the_async_twin_takes_retain(app: App) -> None:
    @app.task(queue="q")
    def later() -> None: ...

    job = asyncio.run(later.options(retain=60).aenqueue())
    assert json.loads(retaining(app.store).job_retain([job.id])[job.id])["failed"] == 60.0


@pytest.mark.parametrize(
    ("retain", "words"),
    [
        (-1, "from 0 to"),
        (float("inf"), "from 0 to"),
        ("soon", "seconds or a timedelta"),
        (True, "seconds or a timedelta"),
        ({"queued": 5}, "not final: queued"),
        ({}, "at least one"),
        ({"failed": "x"}, "seconds or a timedelta"),
        (timedelta(days=40_000), "from 0 to"),
    ],
)
def test_bad_retain_is_refused_with_nothing_written(app: App, retain: object, words: str) -> None:
    @app.task(queue="q")
    def job() -> None: ...

    with pytest.raises(InvalidJobError, match=words):
        job.options(retain=retain).enqueue()
    assert app.store.job_get(1) is None


def test_a_task_default_is_checked_when_registered(app: App) -> None:
    with pytest.raises(ConfigurationError, match=r"task 'bad'.*not final"):

        @app.task(name="bad", retain={"running": 5})
        def bad() -> None: ...


def test_a_rule_reads_back_in_one_line() -> None:
    rule = read_retain(resolve_retain({"failed": timedelta(days=30), "succeeded": 0}))
    assert rule is not None and describe_retain(rule) == "failed 30d, succeeded at once"
    assert describe_retain({"cancelled": timedelta(seconds=90)}) == "cancelled 90s"


def test_cli_and_job_page_show_the_jobs_own_retention(app: App, dsn: str) -> None:
    @app.task(queue="q")
    def work() -> None: ...

    mine = work.options(retain={"failed": timedelta(days=30), "succeeded": 3600}).enqueue()
    plain = work.enqueue()
    shown = CliRunner().invoke(cli, ["jobs", "show", str(mine.id), "--dsn", dsn, "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["retain"] == {"failed": 2592000.0, "succeeded": 3600.0}
    other = CliRunner().invoke(cli, ["jobs", "show", str(plain.id), "--dsn", dsn, "--json"])
    assert json.loads(other.stdout)["retain"] is None
    text = CliRunner().invoke(cli, ["jobs", "show", str(mine.id), "--dsn", dsn]).stdout
    assert "failed 30d, succeeded 1h after it finishes" in text
    with TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{mine.id}").text
        assert 'id="job-kept"' in page and "failed 30d, succeeded 1h" in page
        assert 'id="job-kept"' not in client.get(f"/jobs/{plain.id}").text


def test_a_consumers_housekeeping_applies_the_jobs_own_rules_without_a_policy(
    store: Store,
) -> None:
    mine, plain = store.job_insert_many([new({"succeeded": 0}), new()], NOW)
    finish_all(store, ["complete", "complete"], NOW)
    no_policy = Retention()
    assert not no_policy.enabled
    worker_side = Housekeeping(store, no_policy, "worker", timedelta(seconds=5))
    assert worker_side.run(NOW) == 0  # a worker's maintenance applies them itself
    consumer = Housekeeping(store, no_policy, "consumer", timedelta(seconds=5), own=True)
    assert consumer.run(NOW) == 1 and consumer.is_leader
    assert alive(store, mine.id, plain.id) == [plain.id]
    consumer.release()
