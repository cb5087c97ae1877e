"""SignalStore on Redis: signals and parked waits (conveyor.store.signals), each
call one script (signal_send.lua, signal_wait.lua)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from conveyor.store.records import Lease
from conveyor.store.redis.base import _dt, _ts
from conveyor.store.redis.core import CoreMixin
from conveyor.store.redis.steps import _step_of
from conveyor.store.signals import Sent, Signal, SignalWait, Waiting


class RedisSignals(CoreMixin):
    """SignalStore for the redis store."""

    def signal_send(self, job_id: int, name: str, payload_json: str, now: datetime) -> Sent:
        state, kept, woken = self._run("signal_send", _ts(now), str(job_id), name, payload_json)
        return Sent(None if state is None else str(state), bool(kept), bool(woken))

    def signal_wait(
        self, lease: Lease, name: str, step: str, until: datetime, now: datetime
    ) -> SignalWait | None:
        args = (_ts(now), str(lease.id), lease.token, name, step, _ts(until))
        reply = self._run("signal_wait", *args)
        if reply is None:
            return None
        outcome, marked, entry, unreadable = reply
        self._drop(unreadable)
        recorded = None if not entry else _step_of(step, entry)
        return SignalWait(str(outcome), _dt(marked), recorded)  # type: ignore[arg-type]

    def children_park(
        self, lease: Lease, step: str, children: list[int], until: datetime, now: datetime
    ) -> Literal["ended", "parked"] | None:
        args = (_ts(now), str(lease.id), lease.token, step, json.dumps(children), _ts(until))
        reply = self._run("children_park", *args)
        if reply is None:
            return None
        outcome, unreadable = reply
        self._drop(unreadable)
        return "ended" if outcome == "ended" else "parked"

    def signal_list(self, job_id: int) -> list[Signal]:
        key = self._k("signals", str(job_id))
        entries = self._do(lambda: self._client.lrange(key, 0, -1))
        signals = []
        for number, raw in enumerate(entries, start=1):
            name, payload, sent_at, received_at, step = json.loads(raw)
            received = None if not received_at else _dt(received_at)
            signals.append(Signal(number, name, payload, _dt(sent_at), received, step or None))
        return signals

    def sleep_mark(
        self, lease: Lease, step: str, until: datetime, now: datetime
    ) -> datetime | None:
        marked = self._run("sleep_mark", _ts(now), str(lease.id), lease.token, step, _ts(until))
        return None if marked is None else _dt(marked)

    def wait_wake(self, job_id: int, now: datetime) -> bool:
        return bool(self._run("wait_wake", _ts(now), str(job_id)))

    def parked_counts(self, now: datetime) -> dict[str, int]:
        flat = self._run("parked_counts", _ts(now))
        return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def job_waiting(self, job_id: int) -> Waiting | None:
        found = self._do(lambda: self._client.hgetall(self._k("wait", str(job_id))))
        if not found or "step" not in found:
            return None
        return Waiting.stored(
            found["step"], found.get("signal"), found.get("children"), _dt(found["until"])
        )
