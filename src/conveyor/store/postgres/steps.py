"""StepStore on PostgreSQL: a job's durable steps (docs/effects.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.store.postgres.core import CoreMixin
from conveyor.store.records import Lease, NewStep, Step
from conveyor.store.sql import load_queries
from conveyor.store.sql_shared import record_step

_E = load_queries("conveyor.store.postgres", "steps.sql")


def _row_to_step(row: Sequence[Any]) -> Step:
    return Step(*row[:5])


class StepsMixin(CoreMixin):
    """Steps recorded under a lease, read by later attempts (``StepStore``)."""

    def step_list(self, job_id: int) -> list[Step]:
        with self._conn() as conn:
            rows = conn.execute(_E["step_list"], {"job_id": job_id}).fetchall()
        return [_row_to_step(r) for r in rows]

    def step_record(self, lease: Lease, step: NewStep, now: datetime | None = None) -> Step | None:
        with self._conn() as conn:
            row = record_step(conn, _E, lease, step, step.started_at, now)
        return None if row is None else _row_to_step(row)
