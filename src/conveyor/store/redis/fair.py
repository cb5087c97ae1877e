"""Fair turns on Redis (conveyor.store.fair): a fair queue's claim is
``fair_claim.lua``; the other queues go to the core's claim script untouched.

Which queues are fair is read at most once a FAIR_RECHECK_SECONDS per set of
queues claimed (``fair_any.lua``): a worker of queues that are not fair pays
that one call a second, and no command per job.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from conveyor.job import Job
from conveyor.store.fair import (
    MAX_FAIR_KEYS,
    Aging,
    FairKey,
    FairQueue,
    aging_of,
    claim_in_turns,
    decayed,
    fair_seen,
)
from conveyor.store.redis.base import _now_arg, _pairs, job_of
from conveyor.store.redis.core import CoreMixin


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisFair(CoreMixin):
    """FairStore for the redis store, and the claim that obeys it."""

    def _fair_of(self, names: tuple[str, ...]) -> tuple[frozenset[str], bool]:
        """The fair queues among ``names``, and whether any has limits, as last read."""

        def read() -> tuple[frozenset[str], bool]:
            fair, limited = self._run("fair_any", json.dumps(names))
            return frozenset(_text(q) for q in fair), bool(int(limited))

        answer: tuple[frozenset[str], bool] = fair_seen(self).get(names, read)
        return answer

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
        fair, limited = self._fair_of(names)
        # A fair queue with limits is claimed by the limits' claim (its limits
        # hold; its per-key limits spread the starts over its keys).
        if not fair or limited:
            return super().job_claim(names, limit, worker, lease, now, group)
        return claim_in_turns(
            names,
            fair,
            limit,
            lambda queue, room: self._fair_claim(queue, room, worker, lease, now, group),
            lambda rest, room: super(RedisFair, self).job_claim(
                rest, room, worker, lease, now, group
            ),
        )

    def _fair_claim(
        self,
        queue: str,
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime | None,
        group: str | None,
    ) -> list[Job]:
        flats, unreadable = self._run(
            "fair_claim",
            queue,
            str(limit),
            worker,
            secrets.token_hex(16),
            f"{lease.total_seconds():.6f}",
            _now_arg(now),
            group or "",
        )
        self._drop(unreadable)
        return [job_of(_pairs(f)) for f in flats]

    def fair_set(
        self,
        queue: str,
        weights: dict[str, float] | None,
        default_weight: float,
        now: datetime,
        aging: Aging | None = None,
    ) -> None:
        text = "" if weights is None else json.dumps(weights)
        every, step, cap = (
            ("", 1, 0) if aging is None else (repr(aging.every), aging.step, aging.cap)
        )
        self._run("fair_set", queue, text, repr(float(default_weight)), every, str(step), str(cap))
        fair_seen(self).clear()

    def fair_status(self, queue: str | None, now: datetime) -> list[FairQueue]:
        found: list[FairQueue] = []
        at = now.timestamp()
        for name, weights, default, aging, turns, counts in self._run("fair_status", queue or ""):
            queued = {_text(counts[i]): int(counts[i + 1]) for i in range(0, len(counts), 2)}
            kept: dict[str, tuple[float, float, int]] = {}
            for i in range(0, len(turns), 2):
                _pass, starts, recent, recent_at = _text(turns[i + 1]).split()
                kept[_text(turns[i])] = (float(recent), at - float(recent_at), int(starts))
            keys = [
                FairKey(
                    key or None,
                    queued.get(key, 0),
                    decayed(*kept[key][:2]) if key in kept else 0.0,
                    kept[key][2] if key in kept else 0,
                )
                for key in {**queued, **kept}
                if queued.get(key, 0) or key in kept
            ]
            keys.sort(key=lambda k: (-k.recent_starts, -k.queued, k.key or ""))
            found.append(
                FairQueue(
                    _text(name),
                    dict(json.loads(_text(weights))),
                    float(_text(default)),
                    tuple(keys[:MAX_FAIR_KEYS]),
                    aging_of(float(aging[0]), int(aging[1]), int(aging[2])) if aging else None,
                )
            )
        return found
