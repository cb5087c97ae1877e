"""The unique windows of an enqueue on PostgreSQL (conveyor/unique.py), in unique.sql.

A key held only while live is the unique index jobs_live_key's to decide. A key
that finished jobs hold too ("forever", ``Unique(period=..., states=...)``) is
checked against the jobs the lookup finds; the lock of job_keys_lock makes the
lookup and the insert after it one step for each key, so that another
producer's job of the key, committed and even finished in between, is seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.job import NewJob
from conveyor.store.sql import load_queries

_U = load_queries("conveyor.store.postgres", "unique.sql")


def holds_when_finished(new: NewJob) -> bool:
    """Whether a job's key is held by finished jobs too (so the live-key index is not enough)."""
    return new.key is not None and (new.unique == "forever" or new.unique_states is not None)


def lock_keys(conn: Any, jobs: Sequence[NewJob]) -> None:
    """Lock the keys of ``jobs`` that finished jobs hold, in the caller's transaction,
    before their lookup; nothing is run when none has such a key."""
    pairs = [(new.queue, new.key) for new in jobs if holds_when_finished(new)]
    if pairs:
        params = {"queues": [q for q, _ in pairs], "keys": [k for _, k in pairs]}
        conn.execute(_U["job_keys_lock"], params)
