"""Fair turns on SQLite (conveyor.store.fair): a fair queue's claim is ``fair_claim``,
``fair_clock`` and ``fair_turns`` of ``fair.sql`` in one write transaction; the
other queues go to the core's claim untouched.

Which queues are fair is read at most once a FAIR_RECHECK_SECONDS per set of
queues claimed: a worker of queues that are not fair pays that one statement a
second, and nothing per job.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime

from conveyor.job import Job
from conveyor.store.claims import ClaimAsk
from conveyor.store.fair import (
    MAX_FAIR_KEYS,
    FairKey,
    FairQueue,
    aging_of,
    aging_params,
    claim_in_turns,
    decayed,
    fair_seen,
)
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import _Q, _row_to_job, _ts
from conveyor.store.sqlite.core import CoreMixin, claim_params
from conveyor.store.sqlite.fair_keys import read_fair_keys

_F = load_queries("conveyor.store.sqlite", "fair.sql")


class SQLiteFair(CoreMixin):
    """FairStore for the sqlite store, and the claim that obeys it."""

    def _fair_of(self, names: tuple[str, ...]) -> frozenset[str]:
        """The fair queues among ``names``, as last read (see the module's docstring)."""

        def read() -> frozenset[str]:
            rows = self._conn().execute(_F["fair_any"], {"queues": json.dumps(names)})
            return frozenset(row[0] for row in rows)

        fair: frozenset[str] = fair_seen(self).get(names, read)
        return fair

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        fair = self._fair_of(ask.queues)
        if not fair:
            return super()._claim(ask)
        with self._write() as conn:
            return claim_in_turns(
                ask,
                fair,
                lambda one: self._fair_claim(conn, one),
                lambda rest: self._claim_in(conn, rest),
            )

    def _fair_claim(self, conn: sqlite3.Connection, ask: ClaimAsk) -> list[Job]:
        """The claim of the one fair queue ``ask`` names, its turns moved on and, if
        it has limits, its starts recorded, in the caller's write transaction."""
        queue = json.dumps(ask.queues)
        params = {**claim_params(ask), "queue": ask.queues[0]}
        jobs = [_row_to_job(row) for row in conn.execute(_F["fair_claim"], params)]
        if jobs:
            turns = {"queue": params["queue"], "ids": json.dumps([j.id for j in jobs])}
            conn.execute(_F["fair_clock"], turns)
            conn.execute(_F["fair_turns"], {**turns, "now": params["now"]})
        if conn.execute(_Q["limit_any"], {"queues": queue}).fetchone() is not None:
            self._record_starts(conn, queue, [j.id for j in jobs], params["now"])
        return jobs

    def fair_set(self, fair: FairQueue, now: datetime) -> None:
        params = {
            "queue": fair.queue,
            "weights": json.dumps(fair.weights),
            "default_weight": fair.default_weight,
            "now": _ts(now),
            **aging_params(fair.aging),
        }
        with self._write() as conn:
            conn.execute(_F["fair_set"], params)
        fair_seen(self).clear()

    def fair_off(self, queue: str, now: datetime) -> None:
        with self._write() as conn:
            conn.execute(_F["fair_off_turns"], {"queue": queue})
            conn.execute(_F["fair_off"], {"queue": queue})
        fair_seen(self).clear()

    def job_fair_keys(self, job_ids: Sequence[int]) -> dict[int, str]:
        return read_fair_keys(self._conn(), job_ids) if job_ids else {}

    def fair_status(self, queue: str | None, now: datetime) -> list[FairQueue]:
        conn = self._conn()
        found: list[FairQueue] = []
        for name, weights, default, *aging in conn.execute(
            _F["fair_queues"], {"queue": queue}
        ).fetchall():
            params = {"queue": name, "now": _ts(now), "top": MAX_FAIR_KEYS}
            keys = tuple(
                FairKey(key or None, int(queued), decayed(recent, since), int(starts))
                for key, queued, recent, since, starts in conn.execute(_F["fair_keys"], params)
            )
            found.append(
                FairQueue(name, dict(json.loads(weights)), float(default), keys, aging_of(*aging))
            )
        return found
