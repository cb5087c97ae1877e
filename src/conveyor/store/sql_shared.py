"""What the PostgreSQL and SQLite stores do alike in Python around their own SQL.

Each function takes an open connection (psycopg's or sqlite3's: both have
``execute`` returning a cursor) and the dialect's named statements, so that the
statements stay in each store's ``.sql`` files and the steps between them are
written once. Values a dialect stores differently (SQLite's timestamps) are
converted by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conveyor.store.payloads import PayloadChange
from conveyor.store.records import Lease, NewStep


def record_step(
    conn: Any, queries: Mapping[str, str], lease: Lease, step: NewStep, started_at: Any, now: Any
) -> Any:
    """The row of ``step_record`` (the step as recorded now) or of ``step_get`` (as
    recorded already); None when the lease no longer holds."""
    params = {
        "id": lease.id,
        "token": lease.token,
        "name": step.name,
        "result": step.result_json,
        "started_at": started_at,
        "now": now,
    }
    row = conn.execute(queries["step_record"], params).fetchone()
    if row is None:
        # Recorded already (kept), or the lease is gone (None).
        row = conn.execute(queries["step_get"], {"job_id": lease.id, "name": step.name}).fetchone()
    return row


def rewrite_payloads(
    conn: Any, queries: Mapping[str, str], changes: Sequence[PayloadChange]
) -> int:
    """Apply each change where the value it replaces is still there (payloads.sql);
    how many were written."""
    written = 0
    for change in changes:
        params = {
            "id": change.id,
            "field": change.field,
            "old": change.old,
            "new": change.new,
            "step": change.step,
        }
        name = "payload_rewrite_step" if change.field == "step" else "payload_rewrite_job"
        written += conn.execute(queries[name], params).rowcount
    return written


def control_worker(
    conn: Any, queries: Mapping[str, str], worker_id: str, changes: str
) -> str | None:
    """Merge ``changes`` (JSON) into the worker's asked controls; what it is asked
    now, or None for an unknown worker (worker_control.sql)."""
    found = conn.execute(
        queries["worker_control"], {"id": worker_id, "changes": changes}
    ).fetchone()
    return None if found is None else str(found[0])
