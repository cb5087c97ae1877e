"""Fair turns on the dashboard (the fair panel of a queue's limits page, and its form)
and in /metrics (each fair queue's busiest keys: their starts and queued jobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conveyor.app import App
from conveyor.errors import ConfigurationError
from conveyor.fair import fair_dict
from conveyor.store.fair import FairKey


def fair_context(app: App, queue: str) -> dict[str, Any] | None:
    """The fair panel of a queue's page: None when the store has no fair turns;
    ``fair`` None when the queue is not fair."""
    try:
        found = app.fair_queues(queue).get(queue)
    except ConfigurationError:  # a store without fair turns
        return None
    return {"fair": None if found is None else fair_dict(found)}


def parse_weights(text: str) -> dict[str, float]:
    """``gold=3, silver=2`` (commas or new lines between): the weights a form names."""
    weights: dict[str, float] = {}
    for part in text.replace("\n", ",").split(","):
        if not part.strip():
            continue
        key, sep, number = part.strip().rpartition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{part.strip()!r}: give KEY=WEIGHT, such as gold=3")
        try:
            weights[key.strip()] = float(number)
        except ValueError:
            raise ConfigurationError(f"{part.strip()!r}: the weight must be a number") from None
    return weights


def fair_metrics(out: list[str], app: App) -> None:
    """The fair-turn families of /metrics: per fair queue, its busiest keys (at most
    MAX_FAIR_KEYS, so the series stay bounded whatever the keys)."""
    from conveyor.web.metrics import family, sample  # the writer of the text format

    try:
        found = app.fair_queues()
    except ConfigurationError:  # a store without fair turns
        found = {}
    families: tuple[tuple[str, str, str, Callable[[FairKey], int]], ...] = (
        (
            "conveyor_fair_key_starts_total",
            "counter",
            "Jobs a key of a fair queue started since the queue was made fair (busiest keys).",
            lambda key: key.starts,
        ),
        (
            "conveyor_fair_key_queued",
            "gauge",
            "Queued jobs of a key of a fair queue (busiest keys).",
            lambda key: key.queued,
        ),
    )
    for metric, kind, help_text, value in families:
        family(out, metric, kind, help_text)
        for name, queue in sorted(found.items()):
            for key in queue.keys:
                labels = {"queue": name, "key": key.key if key.key is not None else ""}
                sample(out, metric, labels, value(key))
