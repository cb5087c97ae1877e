"""StepStore on SQLite: a job's durable steps (docs/effects.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.job import utcnow
from conveyor.store.records import Lease, NewStep, Step
from conveyor.store.sql import load_queries
from conveyor.store.sql_shared import record_step
from conveyor.store.sqlite.base import _dt_required, _ts
from conveyor.store.sqlite.core import CoreMixin

_E = load_queries("conveyor.store.sqlite", "steps.sql")


def _row_to_step(row: tuple[Any, ...]) -> Step:
    name, result, attempt, started_at, finished_at = row[:5]
    return Step(name, result, attempt, _dt_required(started_at), _dt_required(finished_at))


class StepsMixin(CoreMixin):
    """Steps recorded under a lease, read by later attempts (``StepStore``)."""

    def step_list(self, job_id: int) -> list[Step]:
        rows = self._conn().execute(_E["step_list"], {"job_id": job_id})
        return [_row_to_step(r) for r in rows]

    def step_record(self, lease: Lease, step: NewStep, now: datetime | None = None) -> Step | None:
        with self._write() as conn:
            row = record_step(conn, _E, lease, step, _ts(step.started_at), _ts(now or utcnow()))
        return None if row is None else _row_to_step(row)
