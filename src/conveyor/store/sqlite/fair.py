"""Fair turns on SQLite (conveyor.store.fair): a fair queue's claim is ``fair_claim``,
``fair_clock`` and ``fair_turns`` of ``fair.sql`` in one write transaction; the
other queues go to the core's claim untouched.

Which queues are fair is read at most once a FAIR_RECHECK_SECONDS per set of
queues claimed: a worker of queues that are not fair pays that one statement a
second, and nothing per job.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta

from conveyor.job import Job, utcnow
from conveyor.store.fair import (
    MAX_FAIR_KEYS,
    Aging,
    FairKey,
    FairQueue,
    aging_of,
    aging_params,
    decayed,
    fair_seen,
)
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import _Q, _row_to_job, _ts
from conveyor.store.sqlite.core import CoreMixin

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

    def job_claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime | None = None,
        group: str | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        names = tuple(dict.fromkeys(queues))
        fair = self._fair_of(names)
        if not fair:
            return super().job_claim(names, limit, worker, lease, now, group)
        jobs: list[Job] = []
        rest = list(names)
        with self._write() as conn:
            # A fair queue with limits is claimed by the limits' claim (its limits
            # hold; its per-key limits spread the starts over its keys).
            limited = conn.execute(_Q["limit_any"], {"queues": json.dumps(names)}).fetchone()
            if limited is None:
                when = now or utcnow()
                params = {
                    "limit": limit,
                    "worker": worker,
                    "token": secrets.token_hex(16),
                    "lease_expires_at": _ts(when + lease),
                    "now": _ts(when),
                    "group": group,
                }
                for queue in names:
                    if queue in fair and len(jobs) < limit:
                        params["queue"], params["limit"] = queue, limit - len(jobs)
                        jobs += _fair_claim(conn, params)
                rest = [q for q in names if q not in fair]
        if rest and len(jobs) < limit:
            jobs += super().job_claim(rest, limit - len(jobs), worker, lease, now, group)
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs

    def fair_set(
        self,
        queue: str,
        weights: dict[str, float] | None,
        default_weight: float,
        now: datetime,
        aging: Aging | None = None,
    ) -> None:
        params = {
            "queue": queue,
            "weights": None if weights is None else json.dumps(weights),
            "default_weight": default_weight,
            "now": _ts(now),
            **aging_params(aging),
        }
        with self._write() as conn:
            if weights is None:
                conn.execute(_F["fair_off_turns"], params)
                conn.execute(_F["fair_off"], params)
            else:
                conn.execute(_F["fair_set"], params)
        fair_seen(self).clear()

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


def _fair_claim(conn: sqlite3.Connection, params: dict[str, object]) -> list[Job]:
    """One fair queue's claim, and its turns moved on, in the caller's transaction."""
    jobs = [_row_to_job(row) for row in conn.execute(_F["fair_claim"], params)]
    if jobs:
        turns = {"queue": params["queue"], "ids": json.dumps([j.id for j in jobs])}
        conn.execute(_F["fair_clock"], turns)
        conn.execute(_F["fair_turns"], {**turns, "now": params["now"]})
    return jobs
