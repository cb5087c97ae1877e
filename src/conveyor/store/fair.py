"""Fair turns: the capability a store gives a fair queue (app.fair), and what it reads back.

A fair queue's claims take ready jobs from its keys in turn (a job's key is its
``fair_key``, by default its ``limit_key``; jobs without one share one key; the
per-key limits count by ``limit_key`` whatever the fair key), weighted, within the priority
order. The turns live in the store, advanced by the claim that starts the jobs,
so every worker of every process shares them. Each store implements it in a
module of its own (``fair.py``, with its claim in ``fair.sql`` or ``fair_claim.lua``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from conveyor.job import Job
from conveyor.store.claims import ClaimAsk

T = TypeVar("T")

#: Most keys one read of a fair queue returns (the busiest: most recent starts, then
#: most queued jobs), so that pages and /metrics stay bounded whatever the keys.
MAX_FAIR_KEYS = 50
#: Time constant, in seconds, of the decay of a key's recent starts (the share shown).
RECENT_SECONDS = 60.0
#: How long a store trusts what it read of which queues are fair before reading
#: again: a queue made fair (or not) is claimed so by every worker within this.
FAIR_RECHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Aging:
    """A queued job's priority counts ``step`` more for every ``every`` seconds it has
    been due, up to ``cap`` more, in the claim's order: no job waits forever behind
    a stream of higher ones."""

    #: Seconds (a timedelta is taken too, and kept as seconds).
    every: float | timedelta
    step: int = 1
    cap: int = 10


@dataclass(frozen=True, slots=True)
class FairKey:
    """One key of a fair queue: its queued jobs and its starts."""

    #: The key (a limit_key), None for the jobs without one.
    key: str | None
    #: Queued jobs of the key (due or not).
    queued: int
    #: Starts of the key, decayed with a time constant of RECENT_SECONDS.
    recent_starts: float
    #: Starts of the key since the queue was made fair.
    starts: int


@dataclass(frozen=True, slots=True)
class FairQueue:
    """A fair queue's settings and, when read with them, its busiest keys."""

    queue: str
    weights: dict[str, float]
    default_weight: float
    keys: tuple[FairKey, ...] = field(default=())
    aging: Aging | None = None

    def weight(self, key: str | None) -> float:
        return self.default_weight if key is None else self.weights.get(key, self.default_weight)

    def share(self, key: FairKey) -> float:
        """The key's share of the recent starts of the keys read (0 to 1)."""
        total = sum(k.recent_starts for k in self.keys)
        return key.recent_starts / total if total > 0 else 0.0


def decayed(recent: float, seconds_since: float) -> float:
    """A recent-starts figure ``seconds_since`` after it was written."""
    return recent * math.exp(-max(seconds_since, 0.0) / RECENT_SECONDS)


class FairSeen(Generic[T]):
    """What a store last read of which queues are fair, per set of queues asked,
    read again once it is FAIR_RECHECK_SECONDS old (and at once after fair_set)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, ...], tuple[T, float]] = {}

    def get(self, names: tuple[str, ...], read: Callable[[], T]) -> T:
        known = self._seen.get(names)
        now = time.monotonic()
        if known is not None and now - known[1] < FAIR_RECHECK_SECONDS:
            return known[0]
        answer = read()
        self._seen[names] = (answer, now)
        return answer

    def clear(self) -> None:
        self._seen.clear()


def fair_seen(store: object) -> FairSeen[Any]:
    """The store's FairSeen, made on first use (the mixins have no __init__ of their own)."""
    seen: FairSeen[Any] = vars(store).setdefault("_fair_seen_cache", FairSeen())
    return seen


def claim_in_turns(
    ask: ClaimAsk,
    fair: frozenset[str],
    fair_claim: Callable[[ClaimAsk], list[Job]],
    plain_claim: Callable[[ClaimAsk], list[Job]],
) -> list[Job]:
    """Up to ``ask.limit`` jobs: each fair queue's by its turns (``fair_claim`` of that
    queue alone), in the order asked, then the other queues' by the plain claim."""
    jobs: list[Job] = []
    for queue in ask.queues:
        if queue in fair and len(jobs) < ask.limit:
            jobs += fair_claim(ask.part([queue], ask.limit - len(jobs)))
    rest = [q for q in ask.queues if q not in fair]
    if rest and len(jobs) < ask.limit:
        jobs += plain_claim(ask.part(rest, ask.limit - len(jobs)))
    jobs.sort(key=lambda j: (-j.priority, j.id))
    return jobs


@runtime_checkable
class FairStore(Protocol):
    def fair_set(self, fair: FairQueue, now: datetime) -> None:
        """Make ``fair.queue`` fair with its weights and aging (kept turns stay; its
        ``keys`` are not read)."""
        ...

    def fair_off(self, queue: str, now: datetime) -> None:
        """Make ``queue`` not fair (its turns forgotten)."""
        ...

    def fair_status(self, queue: str | None, now: datetime) -> list[FairQueue]:
        """The fair queues (or ``queue`` alone, if fair) with their busiest keys."""
        ...

    def job_fair_keys(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The fair keys of their own (``fair_key=``) of those of ``job_ids`` that have
        one: "" for the shared key."""
        ...


def fair_key_of(store: object, job_id: int) -> str | None:
    """A job's fair key of its own ("" for the shared key), or None: it takes turns
    by its limit_key (or the store has no fair turns)."""
    if not isinstance(store, FairStore):
        return None
    return store.job_fair_keys([job_id]).get(job_id)


def aging_params(aging: Aging | None) -> dict[str, float | int | None]:
    """The aging columns of a fair queue's row (the SQL stores' fair_set)."""
    if aging is None:
        return {"aging_every": None, "aging_step": 1, "aging_cap": 0}
    every = aging.every.total_seconds() if isinstance(aging.every, timedelta) else aging.every
    return {"aging_every": every, "aging_step": aging.step, "aging_cap": aging.cap}


def aging_of(every: float | None, step: int, cap: int) -> Aging | None:
    """A fair queue's aging as its row holds it."""
    return None if every is None else Aging(float(every), int(step), int(cap))
