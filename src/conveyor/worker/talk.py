"""What a worker says: a start line, a line per finished job, warnings, a summary.

Everything goes through the standard ``logging`` module (logger
``conveyor.worker``), so an application routes it where it likes; the
``conveyor worker`` command shows it at INFO by default. Each line about a job
carries its ``job_id``, ``task``, ``queue`` and ``attempt`` as fields
(``conveyor.logs.job_fields``), which ``--log-format json`` writes out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from conveyor.job import utcnow
from conveyor.logs import error_fields, job_fields, spelled_duration
from conveyor.store.protocols import JobStore
from conveyor.version import __version__
from conveyor.worker.executor import Running, outcome_name
from conveyor.worker.options import WorkerOptions
from conveyor.worker.runtime import Runtime

log = logging.getLogger("conveyor.worker")


def log_start(runtime: Runtime, worker_id: str, opts: WorkerOptions) -> None:
    health = runtime.health()
    state = (
        f"schema v{health.get('schema_version')}, {health.get('latency_ms')} ms"
        if health.get("ok")
        else f"NOT READY: {health.get('error')}"
    )
    if "persistence" in health:  # Redis: what a restart of the server would keep
        state += f", {health['persistence']}"
    tasks = sorted(runtime.tasks)
    slots = f"{opts.concurrency}" + (f" (+{opts.prefetch} prefetched)" if opts.prefetch else "")
    log.info(
        "worker %s starting: conveyor %s, %s (%s), queues %s, concurrency %s, lease %gs, tasks: %s",
        worker_id,
        __version__,
        runtime.store.description,
        state,
        ",".join(opts.queues),
        slots,
        opts.lease,
        ", ".join(tasks) or "none",
    )
    if health.get("warning"):
        log.warning("%s", health["warning"])
    served = {task.queue for task in runtime.tasks.values()}
    for queue in opts.queues:
        if queue not in served:
            log.warning(
                "queue %r: no task of this worker is declared for it; it passes its jobs "
                "on to workers that know their tasks (is the queue name right?)",
                queue,
            )
    try:
        paused = runtime.store.queue_paused() & set(opts.queues)
    except Exception:
        paused = set()
    for queue in sorted(paused):
        log.warning("queue %r is paused: its jobs wait until `conveyor resume %s`", queue, queue)


def describe_finished(running: Running) -> str:
    """Log one finished job at INFO (WARNING for a failure); return what became of it."""
    outcome = running.recorded
    job = running.job
    label = "lost" if outcome is None else outcome_name(job, outcome)
    # A job passed on because its task is unknown here says so: the deploy may be stuck.
    unknown = running.task is None and label == "snoozed"
    level = logging.WARNING if label == "failed" or unknown else logging.INFO
    if log.isEnabledFor(level):
        took = (time.monotonic() - running.started) * 1000
        # The past is what the attempt took; the future, when the next one runs.
        shown: str = "failed" if label == "retried" else label
        if outcome is not None and outcome.run_at is not None and label in ("retried", "snoozed"):
            wait = (outcome.run_at - utcnow()).total_seconds()
            shown += (
                f", {'retry' if label == 'retried' else 'runs again'} in {spelled_duration(wait)}"
            )
        error = ""
        if running.abort == "timeout" and label in ("failed", "retried"):
            error = f": ran past its timeout of {running.task.timeout if running.task else '?'}s"
        elif outcome is not None and outcome.error and (label in ("failed", "retried") or unknown):
            lines = [line for line in outcome.error.strip().splitlines() if line.strip()]
            error = f": {lines[-1].strip()}" if lines else ""
        log.log(
            level,
            "job %d %s %s, took %.1f ms (attempt %d/%d)%s",
            job.id,
            job.task,
            shown,
            took,
            job.attempts,
            job.max_attempts,
            error,
            extra={
                **job_fields(job),
                "outcome": label,
                "duration_ms": round(took, 3),
                **(error_fields(outcome.error) if error and outcome is not None else {}),
            },
        )
    return label


#: Rescued jobs named one line each per round; the rest in one line.
RESCUE_LINES = 100


def log_rescued(logger: logging.Logger, store: JobStore, ids: list[int], who: str) -> None:
    """One warning per rescued job (with its fields), read back to say what became of it."""
    if not ids:
        return
    try:
        jobs = store.job_get_many(ids[:RESCUE_LINES])
    except Exception:  # only the log: the rescue itself is done
        jobs = []
    for job in jobs:
        state = "queued again" if job.state == "queued" else str(job.state)
        logger.warning(
            "job %d %s rescued: its %s was lost (attempt %d/%d); %s",
            job.id, job.task, who, job.attempts, job.max_attempts, state,
            extra={**job_fields(job), "outcome": "rescued", "state": str(job.state)},
        )  # fmt: skip
    rest = len(ids) - len(jobs)
    if rest:
        logger.warning(
            "rescued %d job(s) whose %s was lost%s: %s",
            rest, who, " besides those above" if jobs else "", ids[len(jobs) : len(jobs) + 10],
        )  # fmt: skip


def log_summary(worker_id: str, counts: Mapping[str, int], elapsed: float) -> None:
    done = sum(counts.values())
    parts = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()) if count)
    log.info(
        "worker %s stopped: %d job(s) in %s%s",
        worker_id,
        done,
        spelled_duration(elapsed),
        f" ({parts})" if parts else "",
    )
