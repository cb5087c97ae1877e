"""What middleware costs: an enqueue call, and the worker's CPU per job, without and with it.

    python benchmarks/middleware.py                       # SQLite, 20,000 jobs, 3 rounds
    python benchmarks/middleware.py --jobs 40000 --rounds 5

In this process, on a fresh SQLite file per run: ``--enqueues`` single
``task.enqueue()`` calls (wall time per call), then a burst worker
(concurrency 16) runs ``--jobs`` no-op jobs, sync and async (CPU time of the
process per job: the worker, its threads and SQLite, which is a library). Each
row is run with no middleware, then with one middleware whose hooks do nothing,
alternating, so that the machine's noise touches both alike; the best of the
rounds is shown. ``--otel`` adds a row with the OpenTelemetry instrumentor
(spans to a no-op exporter), when the SDK is installed.

``--attempt-only`` measures the executor alone, without a database: making a
``Running`` and running a no-op sync handler through ``run_sync`` (best of 7 runs of
100,000), without and with one no-op middleware.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conveyor import App
from conveyor.task import EnqueueOptions

CONCURRENCY = 16


def noop_middleware() -> list[Any]:
    from conveyor.middleware import Middleware

    return [Middleware()]  # the base class: every hook does nothing


def otel_setup() -> Callable[[], None]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    from conveyor.otel import ConveyorInstrumentor

    class Discard(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Discard()))
    instrumentor = ConveyorInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    return instrumentor.uninstrument


def one_run(kind: str, jobs: int, enqueues: int, is_async: bool) -> tuple[float, float]:
    """(µs of wall time per enqueue call, µs of CPU per job run) for one configuration."""
    undo: Callable[[], None] | None = None
    options: dict[str, Any] = {}
    if kind == "one no-op middleware":
        options["middleware"] = noop_middleware()
    elif kind == "OpenTelemetry":
        undo = otel_setup()
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            App(f"sqlite:///{Path(folder) / 'bench.db'}", **options) as app,
        ):
            app.migrate()

            if is_async:

                @app.task(queue="bench", name="noop")
                async def anoop() -> None:
                    await asyncio.sleep(0)

                task: Any = anoop
            else:

                @app.task(queue="bench", name="noop")
                def noop() -> None:
                    return None

                task = noop
            started = time.perf_counter()
            for _ in range(enqueues):
                task.enqueue()
            per_enqueue = (time.perf_counter() - started) / enqueues * 1e6
            for start in range(0, jobs - enqueues, 1000):
                calls = [((), {})] * min(1000, jobs - enqueues - start)
                app.enqueue_calls("noop", calls, EnqueueOptions(queue="bench"))
            cpu = time.process_time()
            app.worker(
                queues=["bench"], concurrency=CONCURRENCY, burst=True, maintenance=False
            ).run()
            per_job = (time.process_time() - cpu) / jobs * 1e6
            done = app.count_jobs(queue="bench").get("succeeded", 0)
            assert done == jobs, f"{done} of {jobs} jobs succeeded"
    finally:
        if undo is not None:
            undo()
    return per_enqueue, per_job


def attempt_cost(with_middleware: bool) -> float:
    """µs to make a Running and run a no-op sync handler through run_sync."""
    from conveyor import Context
    from conveyor.job import Job, JobState, utcnow
    from conveyor.task import Task
    from conveyor.worker.executor import Running, run_sync

    def noop() -> None:
        return None

    task: Task[[], None] = Task(
        None,  # type: ignore[arg-type]  # never enqueued
        noop, name="noop", queue="q", max_attempts=3, priority=0, timeout=None, backoff=None,
    )  # fmt: skip
    job = Job(1, "q", "noop", JobState.RUNNING, "[]", "{}", 0, utcnow(), 1, 3, utcnow())
    job.lease_token = "token"
    extra = {"middleware": tuple(noop_middleware())} if with_middleware else {}

    def one() -> None:
        run_sync(Running(job=job, task=task, context=Context(job), **extra))

    return min(timeit.repeat(one, number=100_000, repeat=7)) / 100_000 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--enqueues", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--otel", action="store_true", help="add a row with the instrumentor")
    parser.add_argument(
        "--without-middleware-only",
        action="store_true",
        help="only the rows without middleware (for code that has none)",
    )
    parser.add_argument("--attempt-only", action="store_true", help="the executor alone")
    options = parser.parse_args()
    if options.attempt_only:
        print(f"no middleware: {attempt_cost(False):.2f} µs per attempt")
        if not options.without_middleware_only:
            print(f"one no-op middleware: {attempt_cost(True):.2f} µs per attempt")
        return
    kinds = ["no middleware"]
    if not options.without_middleware_only:
        kinds.append("one no-op middleware")
        if options.otel:
            kinds.append("OpenTelemetry")
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(options.rounds):
        for is_async in (False, True):
            for kind in kinds:
                got = one_run(kind, options.jobs, options.enqueues, is_async)
                results.setdefault((kind, is_async), []).append(got)
    print("| handlers | middleware | enqueue call (µs) | worker CPU per job (µs) | spread |")
    print("|---|---|---:|---:|---|")
    for (kind, is_async), values in results.items():
        enqueue = min(v[0] for v in values)
        cpu = min(v[1] for v in values)
        spread = f"median {statistics.median(v[1] for v in values):.1f}"
        handlers = "async" if is_async else "sync"
        print(f"| {handlers} | {kind} | {enqueue:.1f} | {cpu:.1f} | {spread} |")


if __name__ == "__main__":
    main()
