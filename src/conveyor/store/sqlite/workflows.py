"""WorkflowStore on SQLite: the edges between jobs read back, declared workflows."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import Job, NewJob
from conveyor.store.records import Relative, WorkflowInfo
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import _dt_required, _row_to_job, _ts
from conveyor.store.sqlite.core import CoreMixin


class WorkflowsMixin(CoreMixin):
    """Jobs that wait for other jobs, and declared workflows (``WorkflowStore``)."""

    def job_parents(self, job_id: int) -> list[Relative]:
        rows = sqlite_flows.relatives(self._conn(), job_id, children=False)
        return _relatives(rows)

    def job_children(self, job_id: int) -> list[Relative]:
        rows = sqlite_flows.relatives(self._conn(), job_id, children=True)
        return _relatives(rows)

    def job_workflow(self, job_id: int) -> str | None:
        row = self._conn().execute(sqlite_flows.Q["job_workflow"], {"id": job_id}).fetchone()
        return None if row is None else row[0]

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        with self._write() as conn:
            params = {"id": workflow_id, "name": name, "jobs": len(jobs), "now": _ts(now)}
            if conn.execute(sqlite_flows.Q["workflow_create"], params).fetchone() is None:
                return self._workflow_jobs(conn, workflow_id), True
            return self.job_insert_many(jobs, now, conn, workflow=workflow_id), False

    def _workflow_jobs(self, conn: sqlite3.Connection, workflow_id: str) -> list[Job]:
        rows = conn.execute(sqlite_flows.Q["workflow_jobs"], {"id": workflow_id})
        return [_row_to_job(r) for r in rows]

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None:
        row = self._conn().execute(sqlite_flows.Q["workflow_get"], {"id": workflow_id}).fetchone()
        return None if row is None else WorkflowInfo(row[0], row[1], row[2], _dt_required(row[3]))

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_list"], {"limit": limit})
        return [WorkflowInfo(r[0], r[1], r[2], _dt_required(r[3])) for r in rows]

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        return self._workflow_jobs(self._conn(), workflow_id)

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_counts"], {"id": workflow_id})
        return {state: count for state, count in sorted(rows)}

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_edges"], {"id": workflow_id})
        return [(child, parent, resolved) for child, parent, resolved in rows]


def _relatives(rows: list[Any]) -> list[Relative]:
    """Relatives from rows of a job's columns, then the relative's id and the edge's
    resolution; a parent deleted since has NULL columns (no job)."""
    return [Relative(r[-2], None if r[0] is None else _row_to_job(r), r[-1]) for r in rows]
