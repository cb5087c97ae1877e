"""An enqueue with on_conflict="replace" on PostgreSQL (replace.sql), in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import HOLD_AT, Job, NewJob
from conveyor.store.postgres.base import _own_cursor, _row_to_job
from conveyor.store.replacing import insert_replacing, replace_params
from conveyor.store.sql import load_queries

_R = load_queries("conveyor.store.postgres", "replace.sql")


def insert_replacing_on(
    store: Any, jobs: Sequence[NewJob], now: datetime, connection: Any, workflow: str | None
) -> list[Job]:
    """``store.job_insert_many`` of a batch with jobs that replace (see replacing.py)."""
    if connection is None:
        with store._tx() as own:
            return insert_replacing_on(store, jobs, now, own, workflow)
    cur = _own_cursor(connection)

    def replace_one(new: NewJob) -> Job | None:
        params = {**replace_params(new), "run_at": new.run_at, "now": now, "hold_at": HOLD_AT}
        row = cur.execute(_R["job_replace"], params).fetchone()
        if row is None:
            cur.execute(_R["job_key_release"], params)
            return None
        return _row_to_job(row)

    def insert(rest: list[NewJob]) -> list[Job]:
        inserted: list[Job] = store.job_insert_many(rest, now, connection, workflow=workflow)
        return inserted

    return insert_replacing(jobs, now, replace_one, insert)
