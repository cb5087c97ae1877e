"""Per-task metrics folded from events, on every store: counts per outcome and the
run-time and queue-wait histograms of known jobs, read back per task and per
minute, with percentiles within a bucket of the truth; prune and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.job import NewJob
from conveyor.store.metrics_protocol import (
    BOUNDS,
    HOUR,
    MINUTE,
    TOTAL,
    MetricsQuery,
    TaskMetricRow,
    TaskMetricsStore,
    bucket_of,
    fold_for_reading,
    histogram,
    percentile,
)
from conveyor.store.protocols import Store
from conveyor.store.records import Finish

START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(minutes=10)


def run_jobs(
    store: Store, queue: str, task: str, waits_runs: list[tuple[float, float]], kind: str
) -> None:
    """Jobs due at START, each claimed after its wait and finished after its run."""
    for wait, run in waits_runs:
        new = NewJob(queue=queue, task=task, args_json="[]", kwargs_json="{}", run_at=START)
        (job,) = store.job_insert_many([new], now=START)
        started = START + timedelta(seconds=wait)
        (claimed,) = store.job_claim([queue], 1, "w1", LEASE, now=started)
        assert claimed.id == job.id
        assert claimed.lease_token is not None
        finish = Finish(claimed.id, claimed.lease_token, kind, result_json="null", error="boom")  # type: ignore[arg-type]
        done = store.job_finish([finish], now=started + timedelta(seconds=run))
        assert done == [job.id]


def fold_all(store: TaskMetricsStore) -> int:
    total = 0
    while (n := store.task_metrics_fold(limit=7)) > 0:  # in steps: the offset moves
        total += n
    return total


def of(rows: list[TaskMetricRow], task: str, series: str) -> int:
    return sum(r.jobs for r in rows if r.task == task and r.series == series)


def test_fold_counts_and_percentiles(store: Store) -> None:
    assert isinstance(store, TaskMetricsStore)
    runs = [(0.5, 0.01 * (i + 1)) for i in range(20)]  # run 10 ms .. 200 ms
    run_jobs(store, "mail", "send", runs, "complete")
    run_jobs(store, "mail", "send", [(30.0, 3.0), (30.0, 3.0)], "fail")
    run_jobs(store, "mail", "digest", [(2.0, 60.0)], "complete")
    folded = fold_all(store)
    assert folded >= 2 * 23  # an enqueued and an ending event per job
    assert store.task_metrics_fold() == 0  # nothing new: nothing folded twice

    since = START - timedelta(hours=1)
    rows = store.task_metrics_read(MetricsQuery(MINUTE, since, "task"))
    assert of(rows, "send", "enqueued") == 22
    assert of(rows, "send", "succeeded") == 20
    assert of(rows, "send", "failed") == 2
    assert of(rows, "digest", "succeeded") == 1
    send = [r for r in rows if r.task == "send" and r.queue == "mail"]
    runs_h = histogram(send, "run")
    waits_h = histogram(send, "wait")
    assert sum(runs_h) == 22 and sum(waits_h) == 22
    assert runs_h[bucket_of(3.0)] == 2
    assert waits_h[bucket_of(30.0)] == 2 and waits_h[bucket_of(0.5)] == 20
    run_sum = sum(r.seconds for r in send if r.series == "run")
    assert run_sum == pytest.approx(sum(r for _, r in runs) + 6.0, rel=1e-3)
    # p50 of the 22 runs is about 110 ms; p99 is one of the 3 s runs: within a bucket.
    p50, p99 = percentile(runs_h, 0.5), percentile(runs_h, 0.99)
    assert p50 is not None and 0.11 / 2**0.5 <= p50 <= 0.11 * 2**0.5
    assert p99 is not None and 3.0 / 2**0.5 <= p99 <= 3.0 * 2**0.5
    assert percentile(histogram(send, "nothing"), 0.5) is None

    # The same samples in the hour rows and the total row, and per minute of one task.
    assert of(store.task_metrics_read(MetricsQuery(HOUR, since, "task")), "send", "run") == 22
    assert (
        of(store.task_metrics_read(MetricsQuery(TOTAL, since, "task")), "send", "succeeded") == 20
    )
    per_minute = store.task_metrics_read(
        MetricsQuery(MINUTE, since, "time", queue="mail", task="digest")
    )
    # Enqueued in the minute of START, ended 62 s later: in the next one.
    starts = {r.start: r.series for r in per_minute if r.series in ("enqueued", "succeeded")}
    assert starts == {int(START.timestamp()): "enqueued", int(START.timestamp()) + 60: "succeeded"}
    assert {r.queue for r in per_minute} == {""}

    # Every task of a queue, and everything: the rows folded for them, not the tasks'.
    def per_time(queue: str | None, task: str | None, series: str) -> int:
        rows = store.task_metrics_read(MetricsQuery(MINUTE, since, "time", queue=queue, task=task))
        return sum(r.jobs for r in rows if r.series == series)

    assert per_time("mail", None, "succeeded") == 21
    assert per_time(None, None, "run") == 23
    assert per_time(None, "send", "failed") == 2
    assert per_time("other", None, "succeeded") == 0
    for span in (600, 21600, 86400):
        assert of(store.task_metrics_read(MetricsQuery(span, since, "task")), "send", "run") == 22
    assert store.task_metrics_read(MetricsQuery(MINUTE, since, "task", queue="nosuch")) == []


def test_prune_keeps_totals(store: Store) -> None:
    assert isinstance(store, TaskMetricsStore)
    run_jobs(store, "q", "t", [(1.0, 1.0)], "complete")
    fold_all(store)
    since = START - timedelta(days=30)
    assert store.task_metrics_prune(START + timedelta(hours=1)) == 0
    assert store.task_metrics_prune(START + timedelta(days=1)) > 0  # the minute rows
    assert store.task_metrics_read(MetricsQuery(MINUTE, since, "task")) == []
    assert of(store.task_metrics_read(MetricsQuery(HOUR, since, "task")), "t", "succeeded") == 1
    assert store.task_metrics_prune(START + timedelta(days=9)) > 0  # the hour rows
    assert store.task_metrics_read(MetricsQuery(HOUR, since, "task")) == []
    assert of(store.task_metrics_read(MetricsQuery(TOTAL, since, "task")), "t", "succeeded") == 1


def test_a_reader_folds_and_prunes(store: Store) -> None:
    assert isinstance(store, TaskMetricsStore)
    run_jobs(store, "q", "t", [(1.0, 1.0)], "complete")
    fold_for_reading(store, START + timedelta(days=1))  # folds, then drops the minute rows
    since = START - timedelta(days=30)
    assert store.task_metrics_read(MetricsQuery(MINUTE, since, "task")) == []
    assert of(store.task_metrics_read(MetricsQuery(HOUR, since, "task")), "t", "succeeded") == 1
    run_jobs(store, "q", "t", [(1.0, 1.0)], "complete")
    fold_for_reading(store, START + timedelta(days=1, minutes=1))  # folds; pruned lately
    assert of(store.task_metrics_read(MetricsQuery(MINUTE, since, "task")), "t", "succeeded") == 1


def test_names_are_data(store: Store) -> None:
    assert isinstance(store, TaskMetricsStore)
    odd = "q'\"; DROP TABLE jobs; --\n:x %s {a}"
    run_jobs(store, odd, odd + "t", [(0.0, 0.5)], "complete")
    fold_all(store)
    rows = store.task_metrics_read(
        MetricsQuery(MINUTE, START - timedelta(hours=1), "task", queue=odd)
    )
    assert {(r.queue, r.task) for r in rows} == {(odd, odd + "t")}


def test_bad_limit(store: Store) -> None:
    assert isinstance(store, TaskMetricsStore)
    with pytest.raises(ValueError, match="limit"):
        store.task_metrics_fold(limit=0)


def test_bounds_match_the_schema(sqlite_store: tuple[str, Store]) -> None:
    _, store = sqlite_store
    rows = store._conn().execute("SELECT le FROM task_metric_bounds ORDER BY bucket")  # type: ignore[attr-defined]
    assert tuple(r[0] for r in rows) == BOUNDS
