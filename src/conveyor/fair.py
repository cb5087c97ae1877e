"""Fair turns across the keys of a queue (``app.fair``): the settings checked, and set.

A queue shared by many tenants lets one tenant's backlog make every other wait:
claims take the oldest ready job of the highest priority. A fair queue's claims
take ready jobs from its keys in turn instead (a job's key is its ``fair_key=``,
by default its ``limit_key``; jobs without one share one key), within the
priority order, a key of weight 3 three times as often as one of weight 1. The
store decides the turns in the claim itself (see ``conveyor.store.fair``); queues
that are not fair are claimed as before and pay nothing for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol

from conveyor.errors import ConfigurationError
from conveyor.job import utcnow, validate_name
from conveyor.store.capabilities import refuse
from conveyor.store.fair import Aging, FairQueue, FairStore, fair_key_of

__all__ = [
    "Aging",
    "FairQueue",
    "check_aging",
    "check_weight",
    "check_weights",
    "fair",
    "fair_dict",
    "fair_queues",
    "fair_store",
    "set_fair",
]

#: The largest weight: a key of this weight takes this many turns to one of weight 1.
MAX_WEIGHT = 1_000_000.0
#: Most keys a queue's weights may name (the weights are read by every claim).
MAX_WEIGHTS = 10_000


def fair_store(store: object, what: str) -> FairStore:
    if isinstance(store, FairStore):
        return store
    refuse(store, FairStore, what)


def check_weight(what: str, value: object) -> float:
    """A weight: a number above 0 and at most MAX_WEIGHT."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{what} must be a number, got {type(value).__name__}")
    weight = float(value)
    if not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT:
        raise ConfigurationError(
            f"{what} must be above 0 and at most {MAX_WEIGHT:,.0f}, got {value!r}"
        )
    return weight


def check_weights(weights: Mapping[str, object] | None) -> dict[str, float]:
    """Weights by key, checked: each key a name, each weight a number above 0."""
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise ConfigurationError(
            f"weights must be a mapping of key to weight, got {type(weights).__name__}"
        )
    if len(weights) > MAX_WEIGHTS:
        raise ConfigurationError(f"weights name {len(weights):,} keys; the most is {MAX_WEIGHTS:,}")
    checked: dict[str, float] = {}
    for key, weight in weights.items():
        validate_name("fair key", key)
        checked[key] = check_weight(f"the weight of key {key!r}", weight)
    return checked


#: The most levels aging may add to a job's priority.
MAX_AGING_CAP = 1_000_000


def check_aging(aging: object) -> Aging | None:
    """An Aging, checked: ``every`` above 0 seconds (a number or a timedelta), ``step``
    and ``cap`` whole numbers of at least 1."""
    if aging is None:
        return None
    if not isinstance(aging, Aging):
        raise ConfigurationError(f"aging must be an Aging(every=..., step=, cap=), got {aging!r}")
    every: object = aging.every
    if isinstance(every, timedelta):
        every = every.total_seconds()
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise ConfigurationError(f"aging's every must be seconds or a timedelta, got {every!r}")
    if not math.isfinite(every) or every <= 0:
        raise ConfigurationError(f"aging's every must be above 0 seconds, got {every!r}")
    for name in ("step", "cap"):
        value = getattr(aging, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_AGING_CAP:
            raise ConfigurationError(
                f"aging's {name} must be a whole number from 1 to {MAX_AGING_CAP:,}, got {value!r}"
            )
    return Aging(float(every), aging.step, aging.cap)


def set_fair(
    store: object,
    queue: str,
    weights: Mapping[str, object] | None,
    default_weight: object,
    enabled: bool,
    aging: object = None,
) -> FairQueue | None:
    """What ``app.fair`` does: check, store, and answer what the queue has now."""
    validate_name("queue", queue)
    fair = fair_store(store, "make queues fair")
    if not isinstance(enabled, bool):
        raise ConfigurationError(f"enabled must be True or False, got {enabled!r}")
    if not enabled:
        if weights or aging is not None:
            raise ConfigurationError(
                f"app.fair({queue!r}, enabled=False) takes no weights and no aging"
            )
        fair.fair_off(queue, utcnow())
        return None
    checked, default = check_weights(weights), check_weight("default_weight", default_weight)
    rule = check_aging(aging)
    settings = FairQueue(queue, checked, default, aging=rule)
    fair.fair_set(settings, utcnow())
    return settings


def fair_dict(queue: FairQueue) -> dict[str, Any]:
    """A fair queue as plain data (``conveyor queues show --json``, the dashboard)."""
    aging = queue.aging
    return {
        "by": "fair_key",  # a job's fair_key=, by default its limit_key
        "weights": queue.weights,
        "default_weight": queue.default_weight,
        "aging": None
        if aging is None
        else {"every": aging.every, "step": aging.step, "cap": aging.cap},
        "keys": [
            {
                "key": key.key,
                "weight": queue.weight(key.key),
                "queued": key.queued,
                "recent_share": round(queue.share(key), 4),
                "starts": key.starts,
            }
            for key in queue.keys
        ],
    }


class _HasStore(Protocol):
    @property
    def store(self) -> Any: ...


# The App's methods (app.py names them: the App stays a facade).


def fair(
    app: _HasStore,
    queue: str,
    weights: Mapping[str, float] | None = None,
    *,
    default_weight: float = 1.0,
    enabled: bool = True,
    aging: Aging | None = None,
) -> FairQueue | None:
    """Claim ``queue``'s ready jobs from its keys (their ``limit_key``) in turn, weighted.

    ``app.fair("reports", weights={"gold": 3})``: a key of weight 3 takes three
    turns to one of ``default_weight``; jobs without a key share one key; turns
    are decided within the priority order. ``aging=Aging(every=60, step=1,
    cap=5)`` also raises a queued job's priority by ``step`` for every ``every``
    seconds it has waited, up to ``cap`` more. ``enabled=False`` makes the
    queue claim in priority order again. Stored in the database: every worker
    claims so within a second. Returns what the queue has now (None: not fair).
    """
    return set_fair(app.store, queue, weights, default_weight, enabled, aging)


def fair_queues(app: _HasStore, queue: str | None = None) -> dict[str, FairQueue]:
    """The fair queues (or ``queue`` alone, when fair) with their busiest keys: queued
    jobs, share of the recent starts, starts since the queue was made fair."""
    if queue is not None:
        validate_name("queue", queue)
    found = fair_store(app.store, "read fair queues").fair_status(queue, utcnow())
    return {f.queue: f for f in found}


def job_fair_key(app: _HasStore, job_id: int) -> str | None:
    """A job's fair key of its own ("" for the shared key), or None when it takes
    turns by its limit_key (``conveyor jobs show``, the job page)."""
    return fair_key_of(app.store, job_id)
