"""Behaviours the queue systems conveyor was specified from have, on every store.

A finished job keeps its last progress; the pull API fails for good, takes a
batch and has its pacing as settings; notifications can be turned off; the
store says what it can do; housekeeping runs wherever jobs are consumed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor import App, Change, ConfigurationError, Context, Fail, JobState, Keep, Retry
from conveyor.errors import JobNotFoundError, JobStateError, StoreUnavailableError
from conveyor.job import utcnow
from conveyor.store.postgres import listener as pg_listener

DEADLINE = 10.0


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def sqlite_app(tmp_path: Path) -> Iterator[App]:
    with App(f"sqlite:///{tmp_path / 'jobs.db'}") as application:
        application.migrate()
        yield application


# --- progress ends true ------------------------------------------------------------


def test_a_finished_job_shows_the_last_progress_it_reported(app: App) -> None:
    @app.task
    def steps(ctx: Context) -> str:
        for step in range(1, 31):
            ctx.progress(step / 30, f"step {step}")  # most wait for their turn
            time.sleep(0.005)
        return "done"

    with app.worker(concurrency=1, maintenance=False):
        job = steps.enqueue()
        assert job.wait(timeout=DEADLINE) == "done"
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED
    assert (done.progress, done.progress_message) == (1.0, "step 30")


def test_a_failed_job_shows_the_last_progress_it_reported(app: App) -> None:
    @app.task(max_attempts=1)
    def breaks(ctx: Context) -> None:
        ctx.progress(0.1, "start")
        ctx.progress(0.4, "page 4")
        raise RuntimeError("broken at page 4")

    with app.worker(concurrency=1, maintenance=False):
        job = breaks.enqueue()
        with pytest.raises(Exception, match="broken at page 4"):
            job.wait(timeout=DEADLINE)
    done = app.get(job.id)
    assert done.state == JobState.FAILED
    assert (done.progress, done.progress_message) == (0.4, "page 4")


# --- the pull API, complete ---------------------------------------------------------


def test_raise_fail_in_a_consumed_job_fails_it_for_good(app: App) -> None:
    job = app.enqueue("charge", [1], queue="pay", max_attempts=3)
    for held in app.consume(["pay"], lease=5, idle_timeout=0.3):
        with held:
            raise Fail("card declined")
    done = app.get(job.id)
    assert (done.state, done.attempts) == (JobState.FAILED, 1)
    assert "card declined" in (done.error or "")


def test_a_consumed_job_fails_for_good_by_an_explicit_call(app: App) -> None:
    by_flag = app.enqueue("charge", [1], queue="pay", max_attempts=5)
    by_name = app.enqueue("charge", [2], queue="pay", max_attempts=5)
    by_fail = app.enqueue("charge", [3], queue="pay", max_attempts=5)
    retried = app.enqueue("charge", [4], queue="pay", max_attempts=5)
    for held in app.consume(["pay"], lease=5, idle_timeout=0.3):
        n = held.args[0]
        if n == 1:
            held.fail("expired card", final=True)
        elif n == 2:
            held.fail_for_good("no such account")
        elif n == 3:
            held.fail(Fail("fraud suspected"))
        elif held.attempts == 1:
            held.fail("gateway timeout", retry_in=3600)
        else:
            raise AssertionError("a retried job came back an hour early")
    for job, error in ((by_flag, "expired card"), (by_name, "no such account"),
                       (by_fail, "fraud suspected")):  # fmt: skip
        done = app.get(job.id)
        assert (done.state, done.attempts) == (JobState.FAILED, 1), error
        assert error in (done.error or "")
    again = app.get(retried.id)
    assert again.state == JobState.QUEUED and again.attempts == 1  # an attempt, retried


def test_raise_retry_in_a_consumed_job_runs_it_later_without_an_attempt(app: App) -> None:
    job = app.enqueue("poll", [], queue="feeds", max_attempts=1)
    before = utcnow()
    for held in app.consume(["feeds"], lease=5, idle_timeout=0.3):
        with held:
            raise Retry(delay=600)
    later = app.get(job.id)
    assert (later.state, later.attempts) == (JobState.QUEUED, 0)
    assert later.run_at >= before + timedelta(seconds=590)


def test_consume_takes_a_batch_each_job_under_its_own_lease(app: App) -> None:
    jobs = [app.enqueue("line", [n], queue="lines") for n in range(5)]
    consumer = app.consume(["lines"], lease=1.5, poll_interval=0.1, batch_size=3)
    seen = []
    for held in consumer:
        if not seen:
            # The batch is claimed in one call: three running, under this consumer.
            running = app.jobs(state="running", queue="lines")
            assert sorted(j.id for j in running) == [j.id for j in jobs[:3]]
            assert {j.worker for j in running} == {consumer._loop.id}
            time.sleep(2.5)  # longer than the lease: the waiting ones are renewed too
        with held:
            seen.append(held.args[0])
        if len(seen) == 4:
            break  # the fifth (claimed in the second batch) goes back
    consumer.close()
    assert seen == [0, 1, 2, 3]
    for job in jobs[:4]:
        done = app.get(job.id)
        assert (done.state, done.attempts) == (JobState.SUCCEEDED, 1)
        assert "rescued" not in [e.kind for e in app.events(job.id)]
    back = app.get(jobs[4].id)
    assert (back.state, back.attempts) == (JobState.QUEUED, 0)


def test_jobs_of_a_batch_not_handed_out_go_back_when_the_loop_ends(app: App) -> None:
    jobs = [app.enqueue("line", [n], queue="lines") for n in range(4)]
    for held in app.consume(["lines"], lease=5, batch_size=4):
        held.complete()
        break
    assert app.get(jobs[0].id).state == JobState.SUCCEEDED
    for job in jobs[1:]:
        back = app.get(job.id)
        assert (back.state, back.attempts) == (JobState.QUEUED, 0)


def test_consume_settings_are_checked(sqlite_app: App) -> None:
    for bad, says in (
        ({"batch_size": 0}, "batch_size must be a whole number from 1"),
        ({"batch_size": 5000}, "batch_size must be a whole number from 1"),
        ({"poll_interval": 0}, "poll_interval must be a positive"),
        ({"backoff_first": 3.0, "backoff_max": 1.0}, "backoff_first must not exceed"),
    ):
        with pytest.raises(ConfigurationError, match=says):
            sqlite_app.consume(["q"], **bad)


def test_consume_backs_off_store_errors_as_set(sqlite_app: App) -> None:
    claims = 0
    original = sqlite_app.store.job_claim

    def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal claims
        claims += 1
        raise StoreUnavailableError("the database restarts")

    sqlite_app.store.job_claim = failing  # type: ignore[method-assign]
    try:
        for patient in (False, True):
            claims = 0
            pause = 0.5 if patient else 0.02
            pace = {"backoff_first": pause, "backoff_max": pause}
            consumer = sqlite_app.consume(["q"], **pace)
            threading.Timer(1.2, consumer.stop).start()
            assert list(consumer) == []
            if patient:
                assert 2 <= claims <= 4  # every half second
            else:
                assert claims >= 15  # every 0.02 s: many more tries in the same time
    finally:
        sqlite_app.store.job_claim = original  # type: ignore[method-assign]


def test_a_consume_only_service_logs_its_rescues(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    job = app.enqueue("step", [1], queue="chat")
    app.store.job_claim(["chat"], 1, "dead", timedelta(seconds=0.3), None)
    caplog.set_level(logging.WARNING)
    for held in app.consume(["chat"], lease=2, poll_interval=0.1, idle_timeout=3):
        held.complete()
        break
    assert app.get(job.id).state == JobState.SUCCEEDED
    # The logger of rescues, whoever does them (a worker's maintenance, a consumer).
    lines = [r for r in caplog.records if r.name == "conveyor.maintenance"]
    assert any(
        f"job {job.id} step rescued" in r.getMessage() and getattr(r, "job_id", None) == job.id
        for r in lines
    ), [r.getMessage() for r in lines]


# --- notifications optional ----------------------------------------------------------


def test_an_app_without_notifications_never_listens_and_still_runs_everything(
    dsn: str,
) -> None:
    with App(dsn) as producer, App(dsn, notifications=False) as consumer:
        producer.migrate()
        assert producer.notifications and not consumer.notifications
        subscribed: list[object] = []
        original = consumer.store.subscribe

        def counted(on_change: Any) -> Any:
            subscribed.append(on_change)
            return original(on_change)

        consumer.store.subscribe = counted  # type: ignore[method-assign]

        @consumer.task(queue="poll")
        def double(n: int) -> int:
            return 2 * n

        with consumer.worker(concurrency=1, poll_interval=0.2, lease=3):
            # Enqueued by another App (another process, to the store): found by the poll.
            job = producer.enqueue("double", [21], queue="poll")
            assert consumer.wait(job.id, timeout=DEADLINE) == 42
        for held in consumer.consume(["poll"], poll_interval=0.2, idle_timeout=0.5):
            raise AssertionError(f"nothing was left, got {held}")
        late = producer.enqueue("double", [5], queue="poll")
        for held in consumer.consume(["poll"], poll_interval=0.2, idle_timeout=2):
            with held:
                pass
            break
        assert consumer.get(late.id).state == JobState.SUCCEEDED
        assert subscribed == []  # no LISTEN, no pub/sub, no watcher: poll only


def test_notifications_follow_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    for value, listens in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("CONVEYOR_NOTIFICATIONS", value)
        with App(dsn) as app:
            assert app.notifications is listens, value
        with App(dsn, notifications=True) as app:
            assert app.notifications  # the argument wins
    monkeypatch.setenv("CONVEYOR_NOTIFICATIONS", "sometimes")
    with pytest.raises(ConfigurationError, match="must be 0 \\(poll only\\) or 1"):
        App(dsn)


def test_poll_only_workers_run_behind_pgbouncer_in_transaction_mode(pg_clean_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from pgbouncer import PgBouncer

    with App(pg_clean_dsn) as direct:
        direct.migrate()
    dbname = str(conninfo_to_dict(pg_clean_dsn)["dbname"])
    with (
        PgBouncer(pg_clean_dsn) as bouncer,
        App(bouncer.dsn_for(dbname), notifications=False, prepare_threshold=None) as app,
    ):

        @app.task(queue="pooled")
        def double(n: int) -> int:
            return 2 * n

        with app.worker(concurrency=2, poll_interval=0.2, lease=3):
            jobs = [double.enqueue(n) for n in range(12)]  # past psycopg's prepare threshold
            assert [app.wait(job.id, timeout=DEADLINE) for job in jobs] == [
                2 * n for n in range(12)
            ]
        late = double.enqueue(50)
        for held in app.consume(["pooled"], poll_interval=0.2, idle_timeout=2):
            with held:
                pass
            break
        assert app.get(late.id).state == JobState.SUCCEEDED
        assert app.stats().queues["pooled"].counts == {"succeeded": 13}


# --- capabilities at run time ---------------------------------------------------------

#: The rows of the store table in docs/getting-started.md, and the capability each shows.
TABLE_ROWS = {
    "enqueue in your own transaction": "caller_transactions",
    "wake-ups across processes": "notifications",
    "rate and concurrency limits": "limits",
    "workers on several machines": "several_machines",
    "the Spark data source": "spark",
    "operators' listings and counts": "operations",
    "worker, `consume`, CLI, dashboard": "jobs",
}
COLUMNS = {"sqlite": 1, "postgres": 2, "redis": 3}


def documented_capabilities(backend: str) -> dict[str, bool]:
    page = (Path(__file__).parent.parent / "docs" / "getting-started.md").read_text()
    found: dict[str, bool] = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        for start, name in TABLE_ROWS.items():
            if cells and cells[0].startswith(start):
                found[name] = not cells[COLUMNS[backend]].startswith("no")
    assert set(found) == set(TABLE_ROWS.values()), "the store table of getting-started.md changed"
    return found


def test_capabilities_answer_as_the_documented_table(dsn: str) -> None:
    backend = next(name for name in COLUMNS if dsn.startswith(name[:5]))
    with App(dsn) as app:
        told = app.capabilities()
        documented = documented_capabilities(backend)
        assert {name: getattr(told, name) for name in documented} == documented
        assert told.durability_report is (backend == "redis")
        assert told.insight and told.store == app.store.description
        assert told.as_dict()["spark"] is (backend != "redis")
    with App(dsn, notifications=False) as quiet:
        assert quiet.capabilities().notifications is False


def test_capabilities_come_from_the_protocols_a_store_implements(tmp_path: Path) -> None:
    from conveyor.store.dsn import open_store
    from test_capabilities import CoreOnly

    inner = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        with App(store=CoreOnly(inner)) as app:
            told = app.capabilities()
            assert told.jobs and told.notifications
            assert not (told.operations or told.insight or told.limits or told.spark)
            assert not (told.caller_transactions or told.durability_report)
            # A file of this machine is not the LocalFileStore it cannot see: the
            # answer follows the protocols, not the class behind them.
            assert told.several_machines
    finally:
        inner.close()


# --- housekeeping wherever jobs are consumed -------------------------------------------


def finish_jobs(app: App, queue: str, outcomes: list[str]) -> list[int]:
    """Enqueue and end one job per outcome ("complete", "fail", "cancel"), in order."""
    ids = []
    for n, outcome in enumerate(outcomes):
        job = app.enqueue("t", [n], queue=queue, max_attempts=1)
        ids.append(job.id)
        if outcome == "cancel":
            app.cancel(job.id)
            continue
        for held in app.consume([queue], lease=5, idle_timeout=0):
            if outcome == "complete":
                held.complete(n)
            else:
                held.fail_for_good(f"broken {n}")
            break
    return ids


def test_trim_keeps_the_newest_finished_jobs_per_state_on_demand(app: App) -> None:
    ids = finish_jobs(app, "q", ["fail", "complete", "fail", "cancel", "fail", "complete"])
    app.enqueue("t", [99], queue="q")  # queued: never trimmed
    app.enqueue("t", [98], queue="other")
    assert app.trim("q", keep=1, states=["failed"]) == 2  # the two older failed jobs
    left = {job.id: job.state for job in app.jobs(queue="q", limit=20)}
    assert ids[0] not in left and ids[2] not in left and left[ids[4]] == JobState.FAILED
    assert left[ids[1]] == left[ids[5]] == JobState.SUCCEEDED and ids[3] in left
    assert app.trim("q", keep=1, states=["failed"]) == 0
    assert app.trim("q", keep=2) == 2  # of the four finished jobs left, all states together
    counts = app.count_jobs(queue="q")
    assert counts == {"ready": 1, "failed": 1, "succeeded": 1}
    assert app.stats().count("succeeded", "q") == 1  # the overview's counts follow
    with pytest.raises(ConfigurationError, match="only finished jobs"):
        app.trim("q", keep=1, states=["queued"])
    with pytest.raises(ConfigurationError, match="keep must be a whole number of jobs"):
        app.trim("q", keep=-1)


def test_a_consume_only_service_applies_retention_per_state(dsn: str) -> None:
    rules = {"failed": Keep(count=1), "succeeded": Keep(age=timedelta(0))}
    with App(dsn, retention_by_state=rules) as app:
        app.migrate()
        app.runtime.retention.count_every = 0  # every round, not once a minute
        ids = finish_jobs(app, "q", ["fail", "fail", "complete", "fail", "cancel"])
        nxt = app.enqueue("t", [9], queue="q")
        seen = 0
        # No Worker anywhere: the consumer's own housekeeping prunes.
        consumer = app.consume(["q"], lease=1, poll_interval=0.1, idle_timeout=3)
        for held in consumer:
            held.complete()
            seen += 1

            def pruned() -> bool:
                return app.count_jobs(queue="q") == {"failed": 1, "cancelled": 1}

            deadline = time.monotonic() + DEADLINE
            while not pruned() and time.monotonic() < deadline:
                time.sleep(0.1)
            break
        consumer.close()
        assert seen == 1
        assert app.count_jobs(queue="q") == {"failed": 1, "cancelled": 1}
        left = {job.id for job in app.jobs(queue="q", limit=20)}
        assert left == {ids[3], ids[4]}  # the newest failed job, and the cancelled one
        assert nxt.id not in left  # succeeded, past its age of 0


def test_retention_rules_are_checked(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    with pytest.raises(ConfigurationError, match="Keep's count must be a number"):
        App(dsn, retention_by_state={"failed": Keep(count=-1)})
    with pytest.raises(ConfigurationError, match="or a Keep"):
        App(dsn, retention_by_state={"failed": Keep(age=3)})  # type: ignore[arg-type]


def test_conveyor_trim_on_the_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from conveyor.cli import cli

    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    with App(dsn) as app:
        app.migrate()
        finish_jobs(app, "mail", ["fail", "fail", "fail", "complete"])
    result = CliRunner().invoke(
        cli, ["trim", "mail", "--keep", "1", "--state", "failed", "--yes", "--dsn", dsn]
    )
    assert result.exit_code == 0, result.output
    assert "trimmed 2 failed job(s) of queue mail (kept the 1 newest)" in result.stdout
    with App(dsn) as app:
        assert app.count_jobs(queue="mail") == {"failed": 1, "succeeded": 1}
    refused = CliRunner().invoke(cli, ["trim", "mail", "--dsn", dsn])
    assert refused.exit_code != 0 and "--keep" in refused.stderr


# --- outcome readers ------------------------------------------------------------------


def test_an_outcome_reader_marks_each_finished_job_processed_once(app: App) -> None:
    ids = finish_jobs(app, "q", ["complete", "fail", "cancel"])
    waiting = app.enqueue("t", [9], queue="q")
    found = app.unprocessed("q")
    assert [job.id for job in found] == ids  # oldest finish first; the queued one is not
    assert found[0].result == 0 and "broken 1" in (found[1].error or "")
    assert [j.id for j in app.unprocessed(states=["failed", "cancelled"])] == ids[1:]

    # Several readers race for one job: exactly one wins the compare-and-set.
    wins: list[bool] = []
    start = threading.Barrier(6)

    def reader() -> None:
        start.wait()
        wins.append(app.mark_processed(ids[0]))

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == [False] * 5 + [True]
    assert app.mark_processed(ids[0]) is False
    assert [job.id for job in app.unprocessed("q")] == ids[1:]
    assert app.mark_processed(waiting.id) is False  # not finished: nothing to mark
    with pytest.raises(JobNotFoundError):
        app.mark_processed(10**9)

    # Run again and finished anew: unprocessed again, for the new outcome.
    assert app.mark_processed(ids[1]) is True
    app.retry(ids[1])
    for held in app.consume(["q"], lease=5, idle_timeout=0):
        if held.id == ids[1]:
            held.complete("second time")
            break
        held.release()
    again = [job for job in app.unprocessed("q") if job.id == ids[1]]
    assert len(again) == 1 and again[0].result == "second time"
    assert app.mark_processed(ids[1]) is True


def test_the_grace_rule_leaves_old_unmarked_outcomes_out(app: App) -> None:
    (old,) = finish_jobs(app, "q", ["complete"])
    time.sleep(0.05)
    assert [j.id for j in app.unprocessed("q", grace=timedelta(seconds=30))] == [old]
    assert app.unprocessed("q", grace=timedelta(seconds=0.01)) == []
    assert app.mark_processed(old) is True  # marking still works past the grace
    with pytest.raises(ConfigurationError, match="limit must be a whole number"):
        app.unprocessed(limit=0)


# --- holding a single job --------------------------------------------------------------

LEASE = timedelta(seconds=30)


def test_a_held_job_is_never_claimed_until_it_is_let_go(app: App) -> None:
    held = app.enqueue("t", [1], queue="q")
    other = app.enqueue("t", [2], queue="q")
    later = app.enqueue("t", [3], queue="q", delay=3600)
    due_later = app.get(later.id).run_at
    assert app.hold(held.id).held and app.hold(later.id).held
    assert app.hold(held.id).held  # holding a held job changes nothing
    assert not app.get(other.id).held
    # Neither a claim, a worker's nor a consumer's, takes it.
    (claimed,) = app.store.job_claim(["q"], 10, "w", LEASE)
    assert claimed.id == other.id
    for job in app.consume(["q"], lease=5, idle_timeout=0.2):
        raise AssertionError(f"a held job was handed out: {job}")
    assert [j.id for j in app.held_jobs()] == [later.id, held.id]
    assert [j.id for j in app.held_jobs("q", before_id=later.id)] == [held.id]
    assert app.held_jobs("elsewhere") == []
    assert "held" in [e.kind for e in app.events(held.id)]
    assert app.count_jobs(queue="q") == {"scheduled": 2, "running": 1}

    let_go = app.unhold(held.id)
    assert not let_go.held and let_go.detailed_state() == "ready"
    assert app.unhold(later.id).run_at == due_later  # the time it had
    assert [e.kind for e in app.events(held.id)][-1] == "unheld"
    (again,) = app.store.job_claim(["q"], 10, "w", LEASE)
    assert again.id == held.id
    assert app.held_jobs() == []


def test_holding_never_touches_a_running_or_finished_job(app: App) -> None:
    job = app.enqueue("t", [1], queue="q")
    (running,) = app.store.job_claim(["q"], 1, "w", LEASE)
    with pytest.raises(JobStateError, match="only a queued job can be held; cancel it"):
        app.hold(job.id)
    after = app.get(job.id)
    assert (after.state, after.lease_token, after.run_at) == (
        JobState.RUNNING, running.lease_token, running.run_at,
    )  # fmt: skip
    assert app.hold_jobs(queue="q") == 0
    with pytest.raises(JobStateError, match="not held: nothing to let go"):
        app.unhold(job.id)
    (done,) = finish_jobs(app, "p", ["complete"])
    with pytest.raises(JobStateError, match="retry it first"):
        app.hold(done)
    with pytest.raises(JobNotFoundError):
        app.hold(10**9)


def test_a_held_head_of_a_group_holds_the_group_behind_it(app: App) -> None:
    first = app.enqueue("t", [1], queue="chat", group="g")
    app.enqueue("t", [2], queue="chat", group="g")
    app.hold(first.id)
    assert app.store.job_claim(["chat"], 10, "w", LEASE) == []  # in order, or not at all
    assert app.hold_jobs(group="g") == 1  # the second one, held too
    assert app.unhold_jobs(group="g") == 2
    (claimed,) = app.store.job_claim(["chat"], 10, "w", LEASE)
    assert claimed.id == first.id


def test_hold_at_the_command_line_and_in_the_dashboard(tmp_path: Path) -> None:
    import re

    from click.testing import CliRunner
    from starlette.testclient import TestClient

    from conveyor.cli import cli
    from conveyor.web import create_app

    dsn = f"sqlite:///{tmp_path / 'jobs.db'}"
    with App(dsn) as app:
        app.migrate()
        job = app.enqueue("t", [1], queue="q")

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, "--dsn", dsn])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    assert f"job {job.id} held" in run("jobs", "hold", str(job.id))
    assert re.search(r"state\s+held", run("jobs", "show", str(job.id)))
    assert '"held": true' in run("jobs", "show", str(job.id), "--json")
    assert re.search(rf"^\s*{job.id}\s.*\bheld\b", run("jobs", "list", "--queue", "q"), re.M)
    assert f"job {job.id} let go" in run("jobs", "unhold", str(job.id))

    with App(dsn) as app, TestClient(create_app(app), base_url="http://127.0.0.1") as client:
        page = client.get(f"/jobs/{job.id}").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token and f'action="/jobs/{job.id}/hold"' in page
        form = {"csrf_token": token.group(1)}
        response = client.post(f"/jobs/{job.id}/hold", data=form, follow_redirects=False)
        assert response.headers["location"] == f"/jobs/{job.id}?notice=held"
        page = client.get(f"/jobs/{job.id}").text
        assert 'class="badge state-held">held' in page and "Held: no worker claims it" in page
        assert 'class="badge state-held">held' in client.get("/jobs?queue=q").text
        assert app.get(job.id).held
        response = client.post(f"/jobs/{job.id}/unhold", data=form, follow_redirects=False)
        assert response.headers["location"] == f"/jobs/{job.id}?notice=unheld"
        assert not app.get(job.id).held
        (claimed,) = app.store.job_claim(["q"], 1, "w", LEASE)
        refused = client.post(f"/jobs/{job.id}/hold", data=form, follow_redirects=False)
        assert refused.status_code == 409 and "only a queued job can be held" in refused.text
        assert app.get(job.id).lease_token == claimed.lease_token


# --- one server, several applications: Redis's prefix, PostgreSQL's search_path -----------


def test_redis_prefixes_keep_two_applications_apart(redis_clean_dsn: str) -> None:
    import redis

    with (
        App(redis_clean_dsn, prefix="{billing}:") as billing,
        App(redis_clean_dsn, prefix="{mail}:") as mail,
    ):
        billing.migrate()
        mail.migrate()
        assert "prefix {billing}:" in billing.store.description

        @mail.task(queue="default")
        def send(to: str) -> str:
            return f"sent to {to}"

        invoice = billing.enqueue("charge", [1])
        letter = send.enqueue("ada")
        with mail.worker(concurrency=1, poll_interval=0.1, lease=3):
            assert letter.wait(timeout=DEADLINE) == "sent to ada"
        # The mail worker never saw billing's job, nor do mail's listings.
        assert billing.get(invoice.id).state == JobState.QUEUED
        assert [j.task for j in mail.jobs()] == ["send"]
        assert [j.task for j in billing.jobs()] == ["charge"]
        assert billing.stats().count("queued") == 1 and mail.stats().count("queued") == 0
        client = redis.Redis.from_url(redis_clean_dsn, decode_responses=True)
        try:
            keys = list(client.scan_iter(count=1000))
        finally:
            client.close()
        assert keys and all(k.startswith(("{billing}:", "{mail}:")) for k in keys), keys
    with pytest.raises(ConfigurationError, match="prefix must be 1 to 100 characters"):
        App(redis_clean_dsn, prefix="")
    # In the DSN, for every command that takes only --dsn: the same keys.
    from click.testing import CliRunner

    from conveyor.cli import cli

    in_dsn = f"{redis_clean_dsn}{'&' if '?' in redis_clean_dsn else '?'}prefix=%7Bbilling%7D:"
    with App(in_dsn) as billing:
        assert [j.task for j in billing.jobs()] == ["charge"]
    listed = CliRunner().invoke(cli, ["jobs", "list", "--json", "--dsn", in_dsn])
    assert listed.exit_code == 0, listed.output
    assert '"task": "charge"' in listed.stdout and '"task": "send"' not in listed.stdout
    with pytest.raises(ConfigurationError, match="two prefixes"):
        App(in_dsn, prefix="{mail}:")


def test_a_postgres_schema_per_application_through_the_dsn(pg_clean_dsn: str) -> None:
    import psycopg

    with psycopg.connect(pg_clean_dsn, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA billing")
        admin.execute("CREATE SCHEMA mail")

    def in_schema(schema: str) -> str:
        # options=-csearch_path=<schema>, URL-encoded: every connection of the App
        # (its pool and its LISTEN connection) makes and finds its tables there.
        joiner = "&" if "?" in pg_clean_dsn else "?"
        return f"{pg_clean_dsn}{joiner}options=-csearch_path%3D{schema}"

    with App(in_schema("billing")) as billing, App(in_schema("mail")) as mail:
        billing.migrate()
        mail.migrate()

        @mail.task
        def send(to: str) -> str:
            return f"sent to {to}"

        invoice = billing.enqueue("charge", [1])
        letter = send.enqueue("ada")
        with mail.worker(concurrency=1, poll_interval=0.1, lease=3):
            assert letter.wait(timeout=DEADLINE) == "sent to ada"
        assert billing.get(invoice.id).state == JobState.QUEUED
        assert invoice.id == letter.id == 1  # each schema numbers its own jobs
        assert [j.task for j in billing.jobs()] == ["charge"]
        assert [j.task for j in mail.jobs()] == ["send"]
    with psycopg.connect(pg_clean_dsn) as conn:
        tables = conn.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'jobs' "
            "ORDER BY 1"
        ).fetchall()
    assert tables == [("billing",), ("mail",)]  # nothing in public


# --- being told that something changed ----------------------------------------------------


def test_on_change_tells_of_other_processes_and_of_this_one(dsn: str) -> None:
    heard: list[Change] = []
    lock = threading.Lock()

    def hear(change: Change) -> None:
        with lock:
            heard.append(change)

    def seen(test: Any) -> bool:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            with lock:
                if any(test(c) for c in heard):
                    return True
            time.sleep(0.02)
        return False

    with App(dsn) as watcher, App(dsn) as producer:
        watcher.migrate()
        with watcher.on_change(hear):
            if not dsn.startswith("sqlite"):
                # The feed says "reconnected" once it listens (and after any outage).
                assert seen(lambda c: c.kind == "reconnected")
            other = producer.enqueue("t", [1], queue="feed")  # another App: through the store
            if dsn.startswith("sqlite"):
                assert seen(lambda c: c.kind == "any")  # the file changed: it cannot say what
            else:
                assert seen(lambda c: c.kind == "jobs" and c.queue == "feed")
            mine = watcher.enqueue("t", [2], queue="mine")
            assert seen(lambda c: c.kind == "jobs" and c.queue == "mine")  # this process
            for held in watcher.consume(["feed"], lease=5, idle_timeout=0):
                held.complete()
                break
            assert seen(lambda c: c.kind == "done" and other.id in c.job_ids)
        with lock:
            heard.clear()
        watcher.cancel(mine.id)  # closed: nothing more is heard
        time.sleep(0.3)
        with lock:
            assert heard == []
