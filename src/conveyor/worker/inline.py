"""Running ready jobs in the calling thread, on the worker's execution path.

What ``App(inline=True)`` and the testing helpers (``conveyor.testing.drain``)
use: claim under a lease, run the handler with the executor, record the
outcome with the completer, exactly as a worker would, one job at a time and
without threads. A task's ``timeout`` is not enforced here, leases are not
renewed (a long lease is taken instead), and a cancel requested while a
handler runs does not stop it. Limits are obeyed: what they hold back stays
queued (and deferred jobs of a queue with limits are not made due early).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from conveyor.context import Context
from conveyor.job import Job, JobState, utcnow
from conveyor.store.records import Lease, Relative, Step
from conveyor.worker import effects
from conveyor.worker.changes import ids_payload
from conveyor.worker.completer import Completer
from conveyor.worker.executor import Running, poison_outcome, run_inline
from conveyor.worker.throttle import throttle_job

if TYPE_CHECKING:
    from conveyor.app import App

#: Lease of a job run here. Long, since nothing renews it while the handler runs.
LEASE = timedelta(minutes=10)
#: How far ahead ``with_scheduled`` looks: every deferred or retrying job is due by then.
FAR_FUTURE = timedelta(days=365 * 100)
#: Jobs one drain runs at most: a handler that always asks to run again cannot loop forever.
DEFAULT_LIMIT = 10_000


def drain(
    app: App,
    queues: Sequence[str] | None = None,
    *,
    with_scheduled: bool = False,
    limit: int = DEFAULT_LIMIT,
) -> dict[str, int]:
    """Run ready jobs in this thread until none is left; count what happened to them."""
    chosen = list(queues) if queues else sorted({t.queue for t in app.tasks.values()})
    counts: dict[str, int] = {}
    if not chosen:
        return counts
    worker = f"inline:{uuid.uuid4().hex[:8]}"
    # A limit is about real time: a claim "as of" the far future would count its
    # rate's window and throttles there, and leave starts dated there.
    limited = with_scheduled and any(app.store.limit_get(q) is not None for q in chosen)
    for _ in range(limit):
        now = utcnow()
        # A claim "as of" a far future moment makes every deferred job due.
        claim_now = now + FAR_FUTURE if with_scheduled and not limited else now
        claimed = app.store.job_claim(chosen, 1, worker, LEASE, claim_now)
        if not claimed and app.store.next_run_in(chosen, claim_now) == 0:
            # A queue with limits that let a job through now (a store that had not
            # seen them yet passed it by): claim again, obeying them.
            claimed = app.store.job_claim(chosen, 1, worker, LEASE, claim_now)
        if not claimed:
            break
        app.changes.publish("claimed", ids_payload(claimed))
        outcome = run_job(app, claimed[0])
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def run_job(app: App, job: Job) -> str:
    """Run one job this caller claimed (``job.lease_token`` set) and record its outcome.

    Returns what became of it: succeeded, retried, failed, snoozed or cancelled
    (or ``lost`` when its lease no longer held).
    """
    running = Running(
        job=job,
        task=app.tasks.get(job.task),
        context=Context(job),
        middleware=app.middleware_chain(),
    )
    running.context._hooks = InlineHooks(app)
    running.outcome = poison_outcome(running)
    if running.outcome is None:
        run_inline(running)
    assert running.outcome is not None
    kind = running.outcome.kind
    written = Completer(app.store, app.changes).record([(running, running.outcome)])
    if job.id not in written:
        return "lost"
    state = app.get(job.id).state
    if kind == "retry" and state == JobState.QUEUED:
        return "retried"
    if kind == "snooze" and state == JobState.QUEUED:
        return "snoozed"
    return str(state)


class InlineHooks:
    """A Context's hooks when its job runs inline: straight to the store."""

    def __init__(self, app: App) -> None:
        self.app = app

    def write_progress(self, job: Job, fraction: float | None, message: str | None) -> bool:
        assert job.lease_token is not None
        lease = Lease(job.id, job.lease_token)
        return self.app.store.job_progress(lease, fraction, message, utcnow())

    def publish_progress(self, job: Job, fraction: float | None, message: str | None) -> None:
        return None  # nobody else waits in this thread while the handler runs

    def heartbeat(self, job: Job) -> bool:
        assert job.lease_token is not None
        lease = Lease(job.id, job.lease_token)
        return bool(self.app.store.job_heartbeat([lease], LEASE, utcnow()))

    def throttle(self, job: Job, seconds: float, whole_queue: bool) -> datetime:
        return throttle_job(self.app, job, seconds, whole_queue)

    def parents(self, job: Job) -> list[Relative]:
        return self.app.parent_edges(job.id)

    def steps(self, job: Job) -> list[Step]:
        return effects.steps(self.app.store, job)

    def record_step(
        self, job: Job, name: str, result_json: str, started_at: datetime
    ) -> Step | None:
        return effects.record_step(self.app.store, job, name, result_json, started_at)

    def complete_in(self, job: Job, connection: Any, result_json: str) -> bool:
        return effects.complete_in(self.app.store, job, connection, result_json)
