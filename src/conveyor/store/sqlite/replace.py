"""An enqueue with on_conflict="replace" on SQLite (replace.sql), in one write transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import HOLD_AT, Job, NewJob
from conveyor.store.replacing import insert_replacing, replace_params
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import _row_to_job, _ts

_R = load_queries("conveyor.store.sqlite", "replace.sql")


def insert_replacing_on(
    store: Any,
    jobs: Sequence[NewJob],
    now: datetime,
    connection: sqlite3.Connection | None,
    workflow: str | None,
) -> list[Job]:
    """``store.job_insert_many`` of a batch with jobs that replace (see replacing.py)."""
    with store._write(connection) as conn:

        def replace_one(new: NewJob) -> Job | None:
            params = {**replace_params(new), "run_at": _ts(new.run_at), "hold_at": _ts(HOLD_AT)}
            row = conn.execute(_R["job_replace"], params).fetchone()
            if row is None:
                conn.execute(_R["job_key_release"], params)
                return None
            job = _row_to_job(row)
            event = {"id": job.id, "queue": job.queue, "task": job.task,
                     "attempt": job.attempts, "now": _ts(now)}  # fmt: skip
            conn.execute(_R["event_insert_replaced"], event)
            return job

        def insert(rest: list[NewJob]) -> list[Job]:
            inserted: list[Job] = store.job_insert_many(rest, now, conn, workflow=workflow)
            return inserted

        return insert_replacing(jobs, now, replace_one, insert)
