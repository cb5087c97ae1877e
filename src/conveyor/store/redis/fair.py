"""Fair turns on Redis (conveyor.store.fair): a fair queue's claim is
``fair_claim.lua``, also when a worker's finish fetches its next jobs; the other
queues go to the core's claim script untouched.

Which queues are fair is read at most once a FAIR_RECHECK_SECONDS per set of
queues claimed (``fair_any.lua``): a worker of queues that are not fair pays
that one call a second, and no command per job.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import Job
from conveyor.store.claims import ClaimAsk
from conveyor.store.fair import (
    MAX_FAIR_KEYS,
    FairKey,
    FairQueue,
    aging_of,
    claim_in_turns,
    decayed,
    fair_seen,
)
from conveyor.store.finish_fetch import FetchNext
from conveyor.store.limiting import LIMIT_SLACK_SECONDS
from conveyor.store.records import Finish
from conveyor.store.redis.base import _now_arg, _pairs, job_of
from conveyor.store.redis.core import CoreMixin


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisFair(CoreMixin):
    """FairStore for the redis store, and the claim that obeys it."""

    def _fair_of(self, names: tuple[str, ...]) -> frozenset[str]:
        """The fair queues among ``names``, as last read."""

        def read() -> frozenset[str]:
            return frozenset(_text(q) for q in self._run("fair_any", json.dumps(names)))

        fair: frozenset[str] = fair_seen(self).get(names, read)
        return fair

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        fair = self._fair_of(ask.queues)
        if not fair:
            return super()._claim(ask)
        return claim_in_turns(ask, fair, self._fair_claim, super()._claim)

    def job_finish_fetch(
        self, finishes: Sequence[Finish], fetch: FetchNext
    ) -> tuple[list[int], list[Job]]:
        # The finish script fetches by the plain claim's rule: the next jobs of a
        # fair queue are claimed by its turns instead, in a call of their own.
        names = tuple(dict.fromkeys(fetch.queues))
        if fetch.limit <= 0 or not names or not self._fair_of(names):
            return super().job_finish_fetch(finishes, fetch)
        ids = self.job_finish(finishes)
        return ids, self._claim(ClaimAsk(names, fetch.limit, fetch.worker, fetch.lease, None, None))

    def _fair_claim(self, ask: ClaimAsk) -> list[Job]:
        """The claim of the one fair queue ``ask`` names, by its turns."""
        flats, unreadable = self._run(
            "fair_claim",
            ask.queues[0],
            str(ask.limit),
            ask.worker,
            secrets.token_hex(16),
            f"{ask.lease.total_seconds():.6f}",
            _now_arg(ask.now),
            ask.group or "",
            str(LIMIT_SLACK_SECONDS),
        )
        self._drop(unreadable)
        return [job_of(_pairs(f)) for f in flats]

    def fair_set(self, fair: FairQueue, now: datetime) -> None:
        aging = fair.aging
        every, step, cap = (
            ("", 1, 0) if aging is None else (repr(aging.every), aging.step, aging.cap)
        )
        weights, default = json.dumps(fair.weights), repr(float(fair.default_weight))
        self._run("fair_set", fair.queue, weights, default, every, str(step), str(cap))
        fair_seen(self).clear()

    def fair_off(self, queue: str, now: datetime) -> None:
        self._run("fair_set", queue, "", "1.0", "", "1", "0")
        fair_seen(self).clear()

    def job_fair_keys(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}

        def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hget(self._k("job", str(job_id)), "fair_key")
            return list(pipe.execute())

        found = zip(job_ids, self._do(read), strict=True)
        return {job_id: _text(key) for job_id, key in found if key is not None}

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
