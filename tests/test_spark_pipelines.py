"""The pipelines on top of the data source: report, archive and fan-in, on both databases.

Jobs are made through the store with an explicit clock (every call takes
``now``), so each wait, run time, outcome and error in the database is one the
test chose; the pipelines then read them back through the ``conveyor`` data
source in the shared local Spark session.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from conveyor.job import Job, NewJob
from conveyor.spark import commands
from conveyor.spark.analytics import PERCENTILES, report
from conveyor.spark.archiving import archive, read_archive
from conveyor.spark.fanin import batch_results
from conveyor.store.protocols import Store
from conveyor.store.records import Finish, Lease
from outcomes import Failure, cancel_one, retry_one

# The Spark data source needs SQL (staging tables, scans by id range): SQLite and
# PostgreSQL only. On Redis it refuses with a clear error (test_spark_options.py).
pytestmark = pytest.mark.sql_only

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)
TIMEOUT_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tasks.py", line 12, in fetch\n'
    "    raise TimeoutError('upstream slow')\n"
    "TimeoutError: upstream slow\n"
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_job(
    queue: str,
    task: str,
    n: int = 0,
    *,
    max_attempts: int = 3,
    batch: str | None = None,
) -> NewJob:
    # Ready at once whenever the test inserts it: waits are measured from
    # created_at (the insert's ``now``), never from run_at.
    return NewJob(
        queue=queue,
        task=task,
        args_json=f"[{n}]",
        kwargs_json="{}",
        run_at=T0 - timedelta(days=1),
        max_attempts=max_attempts,
        batch=batch,
    )


def lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def claim_one(store: Store, queue: str, now: datetime, lease_for: timedelta = LEASE) -> Job:
    (job,) = store.job_claim([queue], 1, "w1", lease_for, now)
    return job


def complete(store: Store, job: Job, now: datetime, result_json: str = "null") -> None:
    assert store.job_finish([Finish.complete(job.id, lease(job).token, result_json)], now) == [
        job.id
    ]


def fail(store: Store, job: Job, now: datetime, error: str, retryable: bool = True) -> None:
    failure = Failure(job.id, lease(job).token, error, now, retryable)
    assert store.job_finish([failure], now) == [job.id]


def nearest_rank(values: list[float], fraction: float) -> float:
    """The percentile as percentile_approx gives it for small groups: an observed value."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


# --- report -------------------------------------------------------------------


@dataclass
class Seeded:
    """What the report over ``[T0, T0 + 1 h)`` must find."""

    waits: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)


def seed_report_jobs(store: Store) -> Seeded:
    seeded = Seeded()
    # Before the window: a job that ran and failed. Neither its outcome nor
    # its error may appear in the report.
    (early,) = store.job_insert_many([new_job("emails", "send", 99, max_attempts=1)], at(-600))
    fail(store, claim_one(store, "emails", at(-590)), at(-580), "SMTPError: refused")

    # images/resize: 20 jobs created together at T0+60 s; job i waits i+1 s
    # and runs 2(i+1) s, so it finishes at T0 + 60 + 3(i+1) s: 19 jobs finish
    # in the minute starting at T0+60 s and the last one at T0+120 s.
    resize = store.job_insert_many([new_job("images", "resize", n) for n in range(20)], at(60))
    for i, job in enumerate(resize):
        claimed = claim_one(store, "images", at(60 + i + 1))
        assert claimed.id == job.id
        complete(store, claimed, at(60 + 3 * (i + 1)))
        seeded.waits.append(i + 1)
        seeded.runs.append(2 * (i + 1))

    # default/flaky: every outcome once, at times of no interest.
    a, b, c, d, e = store.job_insert_many(
        [new_job("default", "flaky", n, max_attempts=2) for n in range(5)], at(300)
    )
    assert cancel_one(store, e.id, at(301)) is not None  # cancelled while queued
    job = claim_one(store, "default", at(310))
    assert job.id == a.id
    fail(store, job, at(311), TIMEOUT_TRACEBACK)  # retried: attempts remain
    job = claim_one(store, "default", at(312))
    assert job.id == a.id  # still the oldest ready job
    fail(store, job, at(313), TIMEOUT_TRACEBACK)  # out of attempts: failed
    job = claim_one(store, "default", at(320))
    assert job.id == b.id
    fail(store, job, at(321), "ValueError: bad size", retryable=False)
    job = claim_one(store, "default", at(330))
    assert job.id == c.id
    complete(store, job, at(331))
    job = claim_one(store, "default", at(340), lease_for=timedelta(seconds=5))
    assert job.id == d.id
    assert store.job_rescue_expired(at(400)) == [d.id]  # the lease ran out: queued again
    job = claim_one(store, "default", at(410))
    assert job.id == d.id
    complete(store, job, at(412))

    # After the window: must not count either.
    (late,) = store.job_insert_many([new_job("emails", "send", 1)], at(3600))
    complete(store, claim_one(store, "emails", at(3600)), at(3601))
    assert early.id != late.id
    return seeded


def rows_by_group(frame: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["queue"], r["task"]): r.asDict() for r in frame.collect()}


def test_report_numbers_match_the_jobs_the_test_ran(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    seeded = seed_report_jobs(store)
    out = tmp_path / "report"

    result = report(spark, dsn, since=timedelta(hours=1), out=out, now=at(3600))

    assert (result.start, result.end) == (T0, at(3600))
    summary = rows_by_group(result.summary)
    # The emails job before the window and the one at its end are left out.
    assert set(summary) == {("images", "resize"), ("default", "flaky")}

    resize = summary[("images", "resize")]
    assert (resize["attempts"], resize["succeeded"], resize["finished"]) == (20, 20, 20)
    assert (resize["failed"], resize["retried"], resize["rescued"]) == (0, 0, 0)
    # Per minute of the run, not of the window: 20 jobs ended in minutes 1 and 2 of the hour.
    assert resize["throughput_per_minute"] == pytest.approx(20 / 2)
    assert resize["peak_per_minute"] == 19
    assert resize["success_rate"] == 1.0
    assert resize["failure_rate"] == 0.0
    for name, fraction in PERCENTILES:
        assert resize[f"wait_{name}"] == pytest.approx(nearest_rank(seeded.waits, fraction))
        assert resize[f"run_{name}"] == pytest.approx(nearest_rank(seeded.runs, fraction))
    # Worked out by hand, so a wrong oracle cannot hide a wrong report.
    assert (resize["wait_p50"], resize["wait_p95"], resize["wait_p99"]) == (10, 19, 20)
    assert (resize["run_p50"], resize["run_p95"], resize["run_p99"]) == (20, 38, 40)

    flaky = summary[("default", "flaky")]
    counts = {k: flaky[k] for k in ("attempts", "succeeded", "failed", "cancelled")}
    assert counts == {"attempts": 6, "succeeded": 2, "failed": 2, "cancelled": 1}
    assert (flaky["retried"], flaky["rescued"], flaky["finished"]) == (1, 1, 5)
    assert flaky["throughput_per_minute"] == pytest.approx(4 / 2)  # minutes 5 and 6
    assert flaky["success_rate"] == pytest.approx(2 / 5)
    assert flaky["failure_rate"] == pytest.approx(2 / 5)
    assert flaky["retry_rate"] == pytest.approx(1 / 6)
    assert flaky["rescue_rate"] == pytest.approx(1 / 6)
    # d waited from T0+300 s to its second claim at T0+410 s; run time is the last attempt.
    assert flaky["wait_p99"] == pytest.approx(110)
    assert flaky["run_p99"] == pytest.approx(2)

    # collect() gives naive local times: astimezone reads them as such.
    by_queue = {
        (r["minute"].astimezone(UTC), r["queue"]): r["jobs"] for r in result.throughput.collect()
    }
    assert by_queue[(at(60), "images")] == 19
    assert by_queue[(at(120), "images")] == 1
    assert sum(n for (_, q), n in by_queue.items() if q == "default") == 4

    errors = [(r["error"], r["count"], r["jobs"]) for r in result.errors.collect()]
    # The traceback is grouped by its last line; the early SMTPError is out of the window.
    assert errors == [
        ("TimeoutError: upstream slow", 2, 1),
        ("worker lost: lease expired", 1, 1),
        ("ValueError: bad size", 1, 1),
    ] or errors == [
        ("TimeoutError: upstream slow", 2, 1),
        ("ValueError: bad size", 1, 1),
        ("worker lost: lease expired", 1, 1),
    ]
    timeout = result.errors.collect()[0]
    assert timeout["latest_text"] == TIMEOUT_TRACEBACK

    # Written out: the same tables as Parquet, and two charts.
    summary_file = spark.read.parquet(str(out / "summary"))
    assert sorted(summary_file.columns) == sorted(result.summary.columns)
    assert rows_by_group(summary_file) == summary
    assert spark.read.parquet(str(out / "errors")).count() == 3
    assert spark.read.parquet(str(out / "throughput")).count() == len(by_queue)
    for chart in ("throughput.png", "latency.png"):
        data = (out / chart).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), chart
        width = int.from_bytes(data[16:20], "big")
        assert width >= 1000, (chart, width)


# --- archive ------------------------------------------------------------------

DAY = timedelta(days=1)


@dataclass
class ArchiveSeed:
    old: list[Job]
    recent: Job
    live: list[Job]


def seed_archive_jobs(store: Store) -> ArchiveSeed:
    """Six terminal jobs finished on 1 and 2 January, a recent one, and two live ones."""
    images = store.job_insert_many([new_job("images", "resize", n) for n in range(4)], T0)
    for job in images[:3]:
        complete(store, claim_one(store, "images", at(10)), at(20), f'{{"n": {job.id}}}')
    (mail,) = store.job_insert_many([new_job("emails", "send", 1, max_attempts=2)], T0)
    fail(store, claim_one(store, "emails", at(30)), at(31), "TimeoutError: slow")
    fail(store, claim_one(store, "emails", at(40)), at(41), "TimeoutError: slow")
    (cancelled,) = store.job_insert_many([new_job("emails", "send", 2)], T0 + DAY)
    cancel_one(store, cancelled.id, T0 + DAY + timedelta(hours=1))
    complete(store, claim_one(store, "images", T0 + DAY), T0 + DAY + timedelta(hours=2))
    (recent,) = store.job_insert_many([new_job("images", "resize", 9)], T0 + 9 * DAY)
    complete(store, claim_one(store, "images", T0 + 9 * DAY), T0 + 9 * DAY)
    live = store.job_insert_many([new_job("default", "t", n) for n in range(2)], T0 + 9 * DAY)
    claim_one(store, "default", T0 + 9 * DAY)
    old = [*images, mail, cancelled]
    return ArchiveSeed(old=old, recent=recent, live=live)


class Crash(Exception):
    pass


def crash_after_write(stage: str, done: int, total: int) -> None:
    if stage == "written":
        raise Crash(f"stopped after writing {done} of {total} jobs")


def test_archive_crash_between_write_and_delete_then_rerun(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    seeded = seed_archive_jobs(store)
    old_ids = sorted(j.id for j in seeded.old)
    # The archive keeps the stored events: an attempt's claim is its end event's
    # started_at, not a row of its own, and a job's enqueue is its created_at
    # (PostgreSQL stores one enqueued event per enqueue statement, named after its
    # first job).
    history = {
        i: [
            (e.seq, e.kind, e.error)
            for e in store.event_list(i)
            if e.kind not in ("claimed", "enqueued")
        ]
        for i in old_ids
    }
    to = str(tmp_path / "archive")
    now = T0 + 10 * DAY

    with pytest.raises(Crash, match="stopped after writing 6 of 6 jobs"):
        archive(spark, dsn, older_than=7 * DAY, to=to, now=now, progress=crash_after_write)

    # The write committed, the delete never ran: the jobs are in both places.
    assert all(store.job_get(i) is not None for i in old_ids)
    assert sorted(r["id"] for r in spark.read.parquet(to).select("id").collect()) == old_ids

    def crash_mid_delete(stage: str, done: int, total: int) -> None:
        if stage == "deleting" and done == 2:
            raise Crash("stopped after the first chunk")

    # A second run stops after deleting its first chunk of two jobs.
    with pytest.raises(Crash):
        archive(spark, dsn, 7 * DAY, to, now=now, progress=crash_mid_delete, delete_chunk=2)
    assert sum(store.job_get(i) is None for i in old_ids) == 2

    stages: list[tuple[str, int, int]] = []
    rerun = archive(
        spark, dsn, older_than=7 * DAY, to=to, now=now, progress=lambda *s: stages.append(s)
    )

    # The rerun wrote nothing again and deleted what the stopped runs had left.
    assert (rerun.selected, rerun.written, rerun.deleted) == (4, 0, 4)
    assert stages[:2] == [("selected", 4, 4), ("written", 0, 4)]
    assert stages[-1] == ("deleting", 4, 4)
    assert all(store.job_get(i) is None for i in old_ids)
    assert all(store.event_list(i) == [] for i in old_ids)
    assert store.job_get(seeded.recent.id) is not None
    assert all(store.job_get(j.id) is not None for j in seeded.live)

    rows = {r["id"]: r for r in spark.read.parquet(to).collect()}
    assert sorted(rows) == old_ids  # each job once
    for job_id, events in history.items():
        archived = [
            (e["seq"], e["kind"], e["error"])
            for e in rows[job_id]["events"]
            if e["kind"] != "enqueued"
        ]
        assert archived == events
    mail = rows[seeded.old[4].id]
    assert (mail["state"], mail["queue"], mail["attempts"]) == ("failed", "emails", 2)
    ended = [e for e in mail["events"] if e["kind"] != "enqueued"]
    assert [(e["kind"], e["started_at"] is not None) for e in ended] == [
        ("retried", True),
        ("failed", True),
    ]
    assert rows[seeded.old[0].id]["result"] == f'{{"n": {seeded.old[0].id}}}'
    partitions = {(str(r["date"]), r["queue"]) for r in rows.values()}
    assert partitions == {
        ("2026-01-01", "images"),
        ("2026-01-01", "emails"),
        ("2026-01-02", "images"),
        ("2026-01-02", "emails"),
    }
    assert (Path(to) / "date=2026-01-02" / "queue=emails").is_dir()

    # Ten days on, the recent job is old too: a later run appends it.
    later = archive(spark, dsn, older_than=7 * DAY, to=to, now=now + 10 * DAY)
    assert (later.selected, later.written, later.deleted) == (1, 1, 1)
    frame = read_archive(spark, to)
    assert frame.count() == 7
    assert frame.select("archive_run").distinct().count() == 2
    assert dict(frame.dtypes)["queue"] == "string"
    assert dict(frame.dtypes)["date"] == "date"


def test_archive_keeps_a_job_retried_after_it_was_written(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    seeded = seed_archive_jobs(store)
    cancelled = seeded.old[5]
    to = str(tmp_path / "archive")
    now = T0 + 10 * DAY

    def retry_after_write(stage: str, done: int, total: int) -> None:
        # An operator retries the job between the write and the delete.
        if stage == "written":
            assert retry_one(store, cancelled.id, now) is not None

    result = archive(spark, dsn, older_than=7 * DAY, to=to, now=now, progress=retry_after_write)

    assert (result.written, result.deleted) == (6, 5)
    kept = store.job_get(cancelled.id)
    assert kept is not None and kept.state == "queued"
    # It finishes again; once old, it is archived a second time, history complete.
    claimed = claim_one(store, "emails", now + DAY)
    complete(store, claimed, now + DAY)
    again = archive(spark, dsn, older_than=7 * DAY, to=to, now=now + 10 * DAY)
    assert (again.written, again.deleted) == (2, 2)  # the recent job and the retried one
    versions = read_archive(spark, to).where(f"id = {cancelled.id}").orderBy("finished_at")
    kinds = [[e["kind"] for e in r["events"]] for r in versions.collect()]
    assert kinds == [
        ["enqueued", "cancelled"],
        ["enqueued", "cancelled", "manual_retry", "succeeded"],
    ]


# --- fan-in ---------------------------------------------------------------------


def seed_batch(store: Store, batch: str, results: list[str | None]) -> list[Job]:
    """One job per result, in order: completed with it, or (None) left queued."""
    jobs = []
    for n, result in enumerate(results):
        # A queue of its own for the job left queued: no later claim can take it.
        queue = "parked" if result is None else "images"
        (job,) = store.job_insert_many([new_job(queue, "resize", n, batch=batch)], T0)
        if result is not None:
            complete(store, claim_one(store, queue, at(1)), at(5), result)
        jobs.append(job)
    return jobs


def test_batch_results_parse_each_jobs_result(spark: SparkSession, dsn: str, store: Store) -> None:
    done = seed_batch(
        store, "b1", ['{"width": 100, "url": "a.png"}', '{"width": 250, "url": "b.png"}', None]
    )
    # A failed job of the batch, and a job of another batch that must not show.
    (failing,) = store.job_insert_many(
        [new_job("failing", "resize", 7, batch="b1", max_attempts=1)], T0
    )
    fail(store, claim_one(store, "failing", at(6)), at(7), "OSError: disk full")
    seed_batch(store, "b2", ["1"])

    frame = batch_results(spark, dsn, "b1")

    rows = frame.collect()
    assert [r["id"] for r in rows] == [*(j.id for j in done), failing.id]
    assert [r["state"] for r in rows] == ["succeeded", "succeeded", "queued", "failed"]
    # The JSON text is kept (compared parsed: a backend may normalise whitespace).
    assert json.loads(rows[0]["result"]) == {"width": 100, "url": "a.png"}
    values = [r["result_value"] for r in rows]
    assert (values[0]["width"], values[0]["url"]) == (100, "a.png")
    assert (values[1]["width"], values[1]["url"]) == (250, "b.png")
    assert values[2:] == [None, None]
    assert rows[3]["error"] == "OSError: disk full"
    # Spark can work on the parsed value directly.
    assert frame.where("result_value.width > 150").select("id").collect()[0]["id"] == done[1].id


def test_batch_results_with_scalar_results_and_a_given_schema(
    spark: SparkSession, dsn: str, store: Store
) -> None:
    seed_batch(store, "scores", ["1", "2.5", '"n/a"'])
    seed_batch(store, "sizes", ['{"width": 10}', '{"width": "wide"}'])

    # Inferred across the batch: a number and a string widen to a string.
    scores = [r["result_value"] for r in batch_results(spark, dsn, "scores").collect()]
    assert scores == ["1", "2.5", "n/a"]
    sizes = batch_results(spark, dsn, "sizes", schema="struct<width: int>")
    assert dict(sizes.dtypes)["result_value"] == "struct<width:int>"
    # A result that does not fit the schema parses to null; its text is kept.
    widths = [
        (r["result_value"]["width"] if r["result_value"] else None, r["result"])
        for r in sizes.collect()
    ]
    assert widths[0][0] == 10
    assert widths[1][0] is None and json.loads(widths[1][1]) == {"width": "wide"}


# --- empty windows ------------------------------------------------------------


def test_pipelines_on_empty_windows(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    seed_archive_jobs(store)
    seed_batch(store, "pending", [None, None])

    # An hour before anything happened: empty tables, and charts that say so.
    quiet = report(spark, dsn, since=timedelta(hours=1), out=tmp_path / "quiet", now=at(-3600))
    assert (quiet.summary.count(), quiet.throughput.count(), quiet.errors.count()) == (0, 0, 0)
    assert (tmp_path / "quiet" / "throughput.png").is_file()

    # On 2 January nothing has been finished for seven days yet: no archive at all.
    to = tmp_path / "archive"
    idle = archive(spark, dsn, older_than=7 * DAY, to=str(to), now=T0 + DAY)
    assert (idle.selected, idle.written, idle.deleted) == (0, 0, 0)
    assert not to.exists()

    # A batch none of whose jobs has a result yet: nothing to infer a type from.
    pending = batch_results(spark, dsn, "pending").collect()
    assert [r["result_value"] for r in pending] == [None, None]


# --- commands -------------------------------------------------------------------
# The pipelines are checked on both databases above; the commands around them
# only on SQLite.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", timedelta(minutes=30)),
        ("24h", timedelta(hours=24)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(days=14)),
        ("90s", timedelta(seconds=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        (" 1.5H ", timedelta(minutes=90)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert commands.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-1d", "1d junk", "h1"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        commands.parse_duration(text)


def test_report_groups_errors_that_differ_only_in_numbers(
    spark: SparkSession, sqlite_store: tuple[str, Store]
) -> None:
    dsn, store = sqlite_store
    store.job_insert_many([new_job("pay", "charge", n, max_attempts=1) for n in range(3)], T0)
    messages = [
        "ValueError: card of customer c00196 declined for 21.95 EUR",
        "ValueError: card of customer c00197 declined for 3.10 EUR",
        "KeyError: 'currency'",
    ]
    for second, message in enumerate(messages, start=1):
        fail(store, claim_one(store, "pay", at(second)), at(second), message, retryable=False)

    result = report(spark, dsn, since=timedelta(hours=1), now=at(3600))

    errors = [(r["error"], r["pattern"], r["count"], r["jobs"]) for r in result.errors.collect()]
    assert errors == [
        (messages[1], "ValueError: card of customer c# declined for #.# EUR", 2, 2),
        (messages[2], messages[2], 1, 1),
    ]


def test_report_command_prints_tables_and_writes_files(
    spark: SparkSession, sqlite_store: tuple[str, Store], tmp_path: Path
) -> None:
    dsn, store = sqlite_store
    seed_report_jobs(store)
    out = tmp_path / "out"

    # The seeded jobs ran on 1 January 2026: a long --since reaches them.
    args = ["--since", "1000d", "--out", str(out), "--dsn", dsn]
    result = CliRunner().invoke(commands.report, args, env={"COLUMNS": "220"})

    assert result.exit_code == 0, result.output
    for text in (
        "Outcomes",
        "images",
        "resize",
        "flaky",
        "Wait p99",
        "TimeoutError: upstream slow",
    ):
        assert text in result.output
    assert (out / "throughput.png").is_file() and (out / "latency.png").is_file()
    assert (out / "summary").is_dir()


def test_report_command_rejects_a_bad_duration(sqlite_store: tuple[str, Store]) -> None:
    dsn, _ = sqlite_store
    result = CliRunner().invoke(commands.report, ["--since", "soon", "--dsn", dsn])

    assert result.exit_code == 2
    assert "'soon' is not a duration" in result.output


def test_commands_check_the_database_before_starting_spark(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    result = CliRunner().invoke(commands.report, ["--dsn", missing])
    assert result.exit_code == 1
    assert "no database at" in result.output
    assert not (tmp_path / "missing.db").exists()

    (tmp_path / "empty.db").touch()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    result = CliRunner().invoke(commands.archive, ["--to", str(tmp_path / "a"), "--dsn", empty])
    assert result.exit_code == 1
    assert "has no conveyor tables: run `conveyor migrate` first" in result.output


def test_archive_command(
    spark: SparkSession, sqlite_store: tuple[str, Store], tmp_path: Path
) -> None:
    dsn, store = sqlite_store
    seeded = seed_archive_jobs(store)
    to = tmp_path / "archive"

    args = ["--older-than", "1d", "--to", str(to), "--dsn", dsn]
    result = CliRunner().invoke(commands.archive, args, env={"COLUMNS": "200"})

    assert result.exit_code == 0, result.output
    # Every terminal job (the six old ones and the recent one) is long finished now.
    assert "7 finished jobs older than the cutoff" in result.output
    assert "Archived 7 jobs" in result.output
    assert "deleted 7 from the store" in result.output
    assert spark.read.parquet(str(to)).count() == 7
    assert store.job_get(seeded.recent.id) is None
    assert all(store.job_get(j.id) is not None for j in seeded.live)


def test_archive_command_keeps_what_it_wrote(
    spark: SparkSession, sqlite_store: tuple[str, Store], tmp_path: Path
) -> None:
    dsn, store = sqlite_store
    seeded = seed_archive_jobs(store)
    to = tmp_path / "archive"

    args = ["--older-than", "1d", "--to", str(to), "--dsn", dsn, "--keep"]
    result = CliRunner().invoke(commands.archive, args, env={"COLUMNS": "200"})

    assert result.exit_code == 0, result.output
    assert "Archived 7 jobs" in result.output
    assert "kept them in the store (--keep)" in result.output
    assert spark.read.parquet(str(to)).count() == 7
    assert all(store.job_get(j.id) is not None for j in [*seeded.old, seeded.recent])
    # A later run without --keep writes nothing twice and deletes what the copy holds.
    result = CliRunner().invoke(commands.archive, args[:-1], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Archived 0 jobs" in result.output and "(7 were already in the archive)" in result.output
    assert "deleted 7 from the store" in result.output
    assert spark.read.parquet(str(to)).count() == 7
    assert store.job_get(seeded.recent.id) is None
