"""Each job's own fair key (``fair_key=``, store/fair.py) on PostgreSQL: written in
the insert's transaction for the jobs that have one, and read back for display."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.job import NewJob
from conveyor.store.sql import load_queries

_K = load_queries("conveyor.store.postgres", "fair_keys.sql")


def write_fair_keys(conn: Any, written: dict[int, NewJob]) -> None:
    """Give the jobs just inserted (id -> the job) their fair keys; nothing is run
    when none has one."""
    pairs = [(i, new.fair_key) for i, new in written.items() if new.fair_key is not None]
    if pairs:
        params = {"ids": [i for i, _ in pairs], "keys": [key for _, key in pairs]}
        conn.execute(_K["job_set_fair_key"], params)


def read_fair_keys(conn: Any, job_ids: Sequence[int]) -> dict[int, str]:
    """The fair keys of those of ``job_ids`` that have one ("" for the shared key)."""
    rows = conn.execute(_K["job_fair_keys"], {"ids": list(job_ids)})
    return {int(i): key for i, key in rows}
