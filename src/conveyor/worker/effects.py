"""What a handler's durable steps and ``ctx.complete`` ask of the store.

Shared by the worker and the inline runner (their Context hooks): each asks
the store for the capability it needs, and refuses clearly when it has none.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.job import Job
from conveyor.store.capabilities import step_store
from conveyor.store.protocols import TransactionalCompletion
from conveyor.store.records import Lease, NewStep, Step

#: What a store without StepStore is refused for.
STEPS = "record durable steps (ctx.step)"


def _lease(job: Job) -> Lease:
    assert job.lease_token is not None
    return Lease(job.id, job.lease_token)


def steps(store: object, job: Job) -> list[Step]:
    return step_store(store, STEPS).step_list(job.id)


def record_step(
    store: object, job: Job, name: str, result_json: str, started_at: datetime
) -> Step | None:
    return step_store(store, STEPS).step_record(_lease(job), NewStep(name, result_json, started_at))


def complete_in(store: object, job: Job, connection: Any, result_json: str) -> bool:
    if not isinstance(store, TransactionalCompletion):
        description = getattr(store, "description", type(store).__name__)
        raise ConfigurationError(
            f"ctx.complete cannot join a transaction on {description}: only the SQL stores "
            "(PostgreSQL, SQLite) complete a job in the caller's transaction; return the "
            "result from the handler instead (and make its effect idempotent)"
        )
    return store.job_complete_in(_lease(job), result_json, connection)
