"""Fair turns on PostgreSQL (conveyor.store.fair): a fair queue's claim is
``fair_claim`` of ``fair.sql``; the other queues go to the core's claim untouched.

Which queues are fair is read at most once a FAIR_RECHECK_SECONDS per set of
queues claimed, by the statement that also tells whether they have limits (the
question the core's claim asks as often), so a worker of queues that are not
fair runs no statement more than before.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg import errors as pg_errors

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
from conveyor.store.limiting import LIMIT_SLACK_SECONDS
from conveyor.store.postgres.base import _row_to_job
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.postgres.fair_keys import read_fair_keys
from conveyor.store.sql import load_queries

_F = load_queries("conveyor.store.postgres", "fair.sql")
#: Claims retried after a group race (as the core's claim does).
_CLAIM_ATTEMPTS = 5


class PostgresFair(CoreMixin):
    """FairStore for the postgres store, and the claim that obeys it."""

    def _fair_of(self, names: tuple[str, ...]) -> frozenset[str]:
        """The fair queues among ``names``, as last read (see the module's docstring)."""

        def read() -> frozenset[str]:
            with self._conn() as conn:
                row = conn.execute(_F["fair_any"], {"queues": list(names)}).fetchone()
            self._saw_limits(names, bool(row and row[1]))
            return frozenset(row[0]) if row else frozenset()

        fair: frozenset[str] = fair_seen(self).get(names, read)
        return fair

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        fair = self._fair_of(ask.queues)
        if not fair:
            return super()._claim(ask)
        return claim_in_turns(ask, fair, self._fair_claim, super()._claim)

    def _fair_claim(self, ask: ClaimAsk) -> list[Job]:
        """The claim of the one fair queue ``ask`` names, by its turns."""
        params: dict[str, Any] = {
            "queue": ask.queues[0],
            "limit": ask.limit,
            "worker": ask.worker,
            "token": secrets.token_hex(16),
            "lease": ask.lease,
            "now": ask.now,
            "group": ask.group,
            "slack": LIMIT_SLACK_SECONDS,
        }
        for _ in range(_CLAIM_ATTEMPTS):
            try:
                with self._conn() as conn:
                    rows = conn.execute(_F["fair_claim"], params).fetchall()
            except pg_errors.UniqueViolation:
                continue  # lost a group race: look again with a new snapshot
            return [_row_to_job(row) for row in rows]
        return []

    def fair_set(self, fair: FairQueue, now: datetime) -> None:
        params = {
            "queue": fair.queue,
            "weights": json.dumps(fair.weights),
            "default_weight": fair.default_weight,
            "now": now,
            **aging_params(fair.aging),
        }
        with self._conn() as conn:
            conn.execute(_F["fair_set"], params)
        fair_seen(self).clear()

    def fair_off(self, queue: str, now: datetime) -> None:
        with self._conn() as conn:
            conn.execute(_F["fair_off"], {"queue": queue})
        fair_seen(self).clear()

    def job_fair_keys(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        with self._conn() as conn:
            return read_fair_keys(conn, job_ids)

    def fair_status(self, queue: str | None, now: datetime) -> list[FairQueue]:
        found: list[FairQueue] = []
        with self._conn() as conn:
            for name, weights, default, *aging in conn.execute(_F["fair_queues"], {"queue": queue}):
                rows = conn.execute(
                    _F["fair_keys"], {"queue": name, "now": now, "top": MAX_FAIR_KEYS}
                ).fetchall()
                keys = tuple(
                    FairKey(key or None, int(queued), decayed(recent, float(since)), int(starts))
                    for key, queued, recent, since, starts in rows
                )
                found.append(
                    FairQueue(
                        name, dict(json.loads(weights)), float(default), keys, aging_of(*aging)
                    )
                )
        return found
