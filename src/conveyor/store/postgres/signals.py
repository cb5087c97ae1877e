"""SignalStore on PostgreSQL: signals and parked waits (conveyor.store.signals), in
``signals.sql``; each method one transaction that locks the job's row first."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from conveyor.store.postgres.base import _Q, _finish_params
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.postgres.steps import _row_to_step
from conveyor.store.records import Finish, Lease
from conveyor.store.signals import Sent, Signal, SignalWait, Waiting, answered
from conveyor.store.sql import load_queries

_S = load_queries("conveyor.store.postgres", "signals.sql")
_STEP_RECORD = load_queries("conveyor.store.postgres", "steps.sql")["step_record"]


class PostgresSignals(CoreMixin):
    """SignalStore for the postgres store."""

    def signal_send(self, job_id: int, name: str, payload_json: str, now: datetime) -> Sent:
        params = {"job_id": job_id, "name": name, "payload": payload_json, "now": now}
        with self._tx() as conn:
            found = conn.execute(_S["signal_lock_job"], params).fetchone()
            kept = conn.execute(_S["signal_insert"], params).fetchone() is not None
            woken = kept and conn.execute(_S["signal_wake"], params).fetchone() is not None
        return Sent(None if found is None else str(found[0]), kept, woken)

    def signal_wait(
        self, lease: Lease, name: str, step: str, until: datetime, now: datetime
    ) -> SignalWait | None:
        params: dict[str, Any] = {
            "id": lease.id, "token": lease.token, "name": name, "step": step,
            "children": None, "until": until, "now": now,
        }  # fmt: skip
        with self._tx() as conn:
            if conn.execute(_S["wait_lock_job"], params).fetchone() is None:
                return None  # the lease is gone
            row = conn.execute(_S["signal_take"], params).fetchone()
            if row is not None:
                conn.execute(_S["wait_end"], params)
                return answered(_row_to_step(row))
            mark = conn.execute(_S["wait_mark"], params).fetchone()
            assert mark is not None  # an upsert answers its row
            marked = mark[0]
            if marked <= now:
                conn.execute(_S["wait_end"], params)
                result = json.dumps({"timeout": marked.isoformat()})
                step_params = {**params, "name": step, "result": result, "started_at": now}
                found = conn.execute(_STEP_RECORD, step_params).fetchone()
                return SignalWait("timeout", marked, None if found is None else _row_to_step(found))
            return SignalWait("parked", marked) if _park(conn, lease, marked, now) else None

    def children_park(
        self, lease: Lease, step: str, children: list[int], until: datetime, now: datetime
    ) -> Literal["ended", "parked"] | None:
        params = {
            "id": lease.id, "token": lease.token, "step": step, "ids": children,
            "children": json.dumps(children), "until": until,
        }  # fmt: skip
        with self._tx() as conn:
            if conn.execute(_S["wait_lock_job"], params).fetchone() is None:
                return None  # the lease is gone
            live = conn.execute(_S["children_live"], params).fetchone()
            if live is None or live[0] == 0:
                conn.execute(_S["wait_end"], params)
                return "ended"
            conn.execute(_S["children_mark"], params)
            return "parked" if _park(conn, lease, until, now) else None

    def signal_list(self, job_id: int) -> list[Signal]:
        with self._conn() as conn:
            rows = conn.execute(_S["signal_list"], {"job_id": job_id}).fetchall()
        return [Signal(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    def sleep_mark(
        self, lease: Lease, step: str, until: datetime, now: datetime
    ) -> datetime | None:
        params = {"id": lease.id, "token": lease.token, "step": step, "until": until, "now": now}
        with self._tx() as conn:
            row = conn.execute(_S["sleep_mark"], params).fetchone()
            if row is None:
                return None  # the lease is gone
            if row[0] <= now:
                conn.execute(_S["sleep_end"], params)
        marked: datetime = row[0]
        return marked

    def wait_wake(self, job_id: int, now: datetime) -> bool:
        params = {"job_id": job_id, "now": now}
        with self._tx() as conn:
            if conn.execute(_S["wait_wake"], params).fetchone() is None:
                return False
            conn.execute(_S["wait_wake_job"], params)
        return True

    def parked_counts(self, now: datetime) -> dict[str, int]:
        with self._conn() as conn:
            rows = conn.execute(_S["parked_counts"], {"now": now}).fetchall()
        return {str(queue): int(n) for queue, n in rows}

    def job_waiting(self, job_id: int) -> Waiting | None:
        with self._conn() as conn:
            row = conn.execute(_S["wait_get"], {"job_id": job_id}).fetchone()
        return None if row is None else Waiting.stored(row[0], row[1], row[2], row[3])


def _park(conn: Any, lease: Lease, until: datetime, now: datetime) -> bool:
    """Park the leased job as a snooze until ``until``, in the caller's transaction
    (which locked its row already); whether it was parked (False: the lease is gone)."""
    snooze = [Finish.snooze(lease.id, lease.token, until)]
    row = conn.execute(_Q["job_complete_in"], _finish_params(snooze, now, flows=True)).fetchone()
    return row is not None and bool(row[1])


def with_children(conn: Any, job_ids: Sequence[int]) -> list[int]:
    """``job_ids`` and the children each queued parent among them waits for (and
    theirs): what an operator's cancel reaches, read in the caller's transaction."""
    rows = conn.execute(_S["cancel_with_children"], {"ids": list(job_ids)}).fetchall()
    return [int(r[0]) for r in rows]
