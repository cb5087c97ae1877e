"""Each job's own fair key (``fair_key=``, store/fair.py) on SQLite: written in the
insert's transaction for the jobs that have one, and read back for display."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from conveyor.store.sql import load_queries

_K = load_queries("conveyor.store.sqlite", "fair_keys.sql")


def write_fair_keys(conn: sqlite3.Connection, keys: list[tuple[int, str | None]]) -> None:
    """Give the jobs just inserted (id, fair key) their fair keys; nothing is run
    when none has one."""
    pairs = [[i, key] for i, key in keys if key is not None]
    if pairs:
        conn.execute(_K["job_set_fair_key"], {"keys": json.dumps(pairs)})


def read_fair_keys(conn: sqlite3.Connection, job_ids: Sequence[int]) -> dict[int, str]:
    """The fair keys of those of ``job_ids`` that have one ("" for the shared key)."""
    rows = conn.execute(_K["job_fair_keys"], {"ids": json.dumps(list(job_ids))})
    return {int(i): key for i, key in rows}
