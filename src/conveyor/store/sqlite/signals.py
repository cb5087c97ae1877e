"""SignalStore on SQLite: signals and parked waits (conveyor.store.signals), in
``signals.sql``; each method one write transaction under SQLite's write lock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from conveyor.store.records import Finish, Lease
from conveyor.store.signals import Sent, Signal, SignalWait, Waiting, answered
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import _dt, _dt_required, _finish, _ts
from conveyor.store.sqlite.core import CoreMixin
from conveyor.store.sqlite.steps import _row_to_step

_S = load_queries("conveyor.store.sqlite", "signals.sql")


class SQLiteSignals(CoreMixin):
    """SignalStore for the sqlite store."""

    def signal_send(self, job_id: int, name: str, payload_json: str, now: datetime) -> Sent:
        params = {"job_id": job_id, "name": name, "payload": payload_json, "now": _ts(now)}
        with self._write() as conn:
            found = conn.execute(_S["signal_job_state"], params).fetchone()
            kept = conn.execute(_S["signal_insert"], params).fetchone() is not None
            woken = kept and conn.execute(_S["signal_wake"], params).fetchone() is not None
        return Sent(None if found is None else str(found[0]), kept, woken)

    def signal_wait(
        self, lease: Lease, name: str, step: str, until: datetime, now: datetime
    ) -> SignalWait | None:
        now_ts = _ts(now)
        params: dict[str, Any] = {
            "id": lease.id, "token": lease.token, "name": name, "step": step,
            "children": None, "until": _ts(until), "now": now_ts,
        }  # fmt: skip
        with self._write() as conn:
            if conn.execute(_S["signal_take"], params).fetchone() is not None:
                row = conn.execute(_S["signal_take_step"], params).fetchone()
                conn.execute(_S["wait_end"], params)
                marked = until if row is None else _dt_required(row[4])
                return SignalWait("received", marked, None if row is None else _row_to_step(row))
            recorded = conn.execute(_S["signal_step_recorded"], params).fetchone()
            if recorded is not None:  # a replay's answer: no signal taken for it
                conn.execute(_S["wait_end"], params)
                return answered(_row_to_step(recorded))
            return _wait_or_park(conn, lease, params)

    def signal_list(self, job_id: int) -> list[Signal]:
        rows = self._conn().execute(_S["signal_list"], {"job_id": job_id}).fetchall()
        return [Signal(r[0], r[1], r[2], _dt_required(r[3]), _dt(r[4]), r[5]) for r in rows]

    def children_park(
        self, lease: Lease, step: str, children: list[int], until: datetime, now: datetime
    ) -> Literal["ended", "parked"] | None:
        params = {
            "id": lease.id, "token": lease.token, "step": step,
            "children": json.dumps(children), "until": _ts(until),
        }  # fmt: skip
        with self._write() as conn:
            if conn.execute(_S["wait_lease"], params).fetchone() is None:
                return None  # the lease is gone: the wait is another attempt's now
            (live,) = conn.execute(_S["children_live"], params).fetchone()
            if live == 0:
                conn.execute(_S["wait_end"], params)
                return "ended"
            if conn.execute(_S["children_mark"], params).fetchone() is None:
                return None  # the lease is gone
            parked = _finish(conn, [Finish.snooze(lease.id, lease.token, until)], _ts(now))
        return "parked" if parked else None

    def sleep_mark(
        self, lease: Lease, step: str, until: datetime, now: datetime
    ) -> datetime | None:
        params = {"id": lease.id, "token": lease.token, "step": step, "until": _ts(until)}
        with self._write() as conn:
            row = conn.execute(_S["sleep_mark"], params).fetchone()
            if row is None:
                return None  # the lease is gone
            if row[0] <= _ts(now):
                conn.execute(_S["sleep_end"], {"id": lease.id, "now": _ts(now)})
        return _dt_required(row[0])

    def wait_wake(self, job_id: int, now: datetime) -> bool:
        params = {"job_id": job_id, "now": _ts(now)}
        with self._write() as conn:
            if conn.execute(_S["wait_wake"], params).fetchone() is None:
                return False
            conn.execute(_S["wait_wake_job"], params)
        return True

    def parked_counts(self, now: datetime) -> dict[str, int]:
        rows = self._conn().execute(_S["parked_counts"], {"now": _ts(now)}).fetchall()
        return {str(queue): int(n) for queue, n in rows}

    def job_waiting(self, job_id: int) -> Waiting | None:
        row = self._conn().execute(_S["wait_get"], {"job_id": job_id}).fetchone()
        if row is None:
            return None
        return Waiting.stored(row[0], row[1], row[2], _dt_required(row[3]))


def with_children(conn: Any, job_ids: Sequence[int]) -> list[int]:
    """``job_ids`` and the children each queued parent among them waits for (and
    theirs): what an operator's cancel reaches, read in the caller's transaction."""
    rows = conn.execute(_S["cancel_with_children"], {"ids": json.dumps(list(job_ids))})
    return [int(r[0]) for r in rows]


def _wait_or_park(conn: Any, lease: Lease, params: dict[str, Any]) -> SignalWait | None:
    """Mark the wait (keeping the time an earlier attempt marked); record its step as
    timed out once that time is over, else park the job until then. In the caller's
    write transaction, after it found nothing to take."""
    marked = conn.execute(_S["wait_mark"], params).fetchone()
    if marked is None:
        return None  # the lease is gone
    until = _dt_required(marked[0])
    if marked[0] <= params["now"]:
        conn.execute(_S["wait_end"], params)
        result = json.dumps({"timeout": until.isoformat()})
        step_params = {
            **params,
            "name": params["step"],
            "result": result,
            "started_at": params["now"],
        }
        row = conn.execute(_STEP_RECORD, step_params).fetchone()
        return SignalWait("timeout", until, None if row is None else _row_to_step(row))
    parked = _finish(conn, [Finish.snooze(lease.id, lease.token, until)], params["now"])
    return SignalWait("parked", until) if parked else None


_STEP_RECORD = load_queries("conveyor.store.sqlite", "steps.sql")["step_record"]
