"""The pipelines on top of the data source: report, archive and fan-in, on both databases.

Jobs are made through the store with an explicit clock (every call takes
``now``), so each wait, run time, outcome and error in the database is one the
test chose; the pipelines then read them back through the ``conveyor`` data
source in the shared local Spark session.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from conveyor.job import Job, NewJob
from conveyor.spark.report import PERCENTILES, Report, report
from conveyor.store.base import Completion, Failure, Lease, Store
from conveyor.store.dsn import open_store

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


@pytest.fixture
def store(dsn: str) -> Iterator[Store]:
    opened = open_store(dsn)
    opened.migrate()
    yield opened
    opened.close()


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
    assert store.job_complete([Completion(job.id, lease(job).token, result_json)], now) == [job.id]


def fail(store: Store, job: Job, now: datetime, error: str, retryable: bool = True) -> None:
    failure = Failure(job.id, lease(job).token, error, now, retryable)
    assert store.job_fail([failure], now) == [job.id]


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
    assert store.job_cancel(e.id, at(301)) is not None  # cancelled while queued
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
    spark: SparkSession, dsn: str, store: Store
) -> None:
    seeded = seed_report_jobs(store)

    result = report(spark, dsn, since=timedelta(hours=1), now=at(3600))

    assert (result.start, result.end) == (T0, at(3600))
    summary = rows_by_group(result.summary)
    # The emails job before the window and the one at its end are left out.
    assert set(summary) == {("images", "resize"), ("default", "flaky")}

    resize = summary[("images", "resize")]
    assert (resize["attempts"], resize["succeeded"], resize["finished"]) == (20, 20, 20)
    assert (resize["failed"], resize["retried"], resize["rescued"]) == (0, 0, 0)
    assert resize["throughput_per_minute"] == pytest.approx(20 / 60)
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
    assert flaky["throughput_per_minute"] == pytest.approx(4 / 60)
    assert flaky["success_rate"] == pytest.approx(2 / 5)
    assert flaky["failure_rate"] == pytest.approx(2 / 5)
    assert flaky["retry_rate"] == pytest.approx(1 / 6)
    assert flaky["rescue_rate"] == pytest.approx(1 / 6)
    # d waited from T0+300 s to its second claim at T0+410 s; run time is the last attempt.
    assert flaky["wait_p99"] == pytest.approx(110)
    assert flaky["run_p99"] == pytest.approx(2)

    throughput = {(r["minute"], r["queue"]): r["jobs"] for r in result.throughput.collect()}
    minute = {m.replace(tzinfo=UTC) if m.tzinfo is None else m for m, _ in throughput}
    assert at(60) in minute and at(120) in minute
    by_queue = {
        (m.replace(tzinfo=UTC) if m.tzinfo is None else m, q): n for (m, q), n in throughput.items()
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


def test_report_writes_parquet_and_charts(
    spark: SparkSession, dsn: str, store: Store, tmp_path: Path
) -> None:
    seed_report_jobs(store)
    out = tmp_path / "report"

    result = report(spark, dsn, since=timedelta(hours=1), out=out, now=at(3600))

    summary = spark.read.parquet(str(out / "summary"))
    assert sorted(summary.columns) == sorted(result.summary.columns)
    assert rows_by_group(summary) == rows_by_group(result.summary)
    assert spark.read.parquet(str(out / "errors")).count() == 3
    assert spark.read.parquet(str(out / "throughput")).count() == result.throughput.count()
    for chart in ("throughput.png", "latency.png"):
        data = (out / chart).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), chart
        width = int.from_bytes(data[16:20], "big")
        assert width >= 1000, (chart, width)
