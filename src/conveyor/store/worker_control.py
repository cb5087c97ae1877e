"""What an operator asks of a running worker, carried by the store so that it works
across machines: ``quiet`` (claim nothing new; finish what it holds), ``stop`` (a
graceful stop), ``concurrency`` (its slots from now on).

The store keeps it on the worker's row (``workers.control``, JSON; a field of the
worker's hash on Redis); the worker reads it with its check-in (``worker_beat``
returns it), so a request takes effect within one check-in (a third of the
lease) and costs no read of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from conveyor.errors import ConfigurationError

#: The requests a worker obeys, and what each takes.
CONTROLS = {"quiet": bool, "stop": bool, "concurrency": int}
#: The most slots a worker is asked to run.
MAX_CONCURRENCY = 10_000


@runtime_checkable
class WorkerControlStore(Protocol):
    def worker_control(self, worker_id: str, changes: str) -> str | None:
        """Merge ``changes`` (JSON; a key set to null drops it) into what was asked of
        the worker; the control now, or None when no such worker is registered."""
        ...


def control_changes(
    quiet: bool | None = None, stop: bool | None = None, concurrency: int | None = None
) -> str:
    """The JSON of the changes asked, checked. ``quiet=False`` lifts a quiet."""
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise ConfigurationError(
            f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,}, got {concurrency!r}"
        )
    changes: dict[str, Any] = {}
    if quiet is not None:
        changes["quiet"] = True if quiet else None
    if stop:
        changes["stop"] = True
    if concurrency is not None:
        changes["concurrency"] = concurrency
    if not changes:
        raise ConfigurationError("ask something of the worker: quiet, stop or concurrency")
    return json.dumps(changes)


def read_control(text: str | None) -> dict[str, Any]:
    """A stored control, as a worker obeys it: unknown or mistyped fields left out."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(raw, Mapping):
        return {}
    return {
        name: value
        for name, value in raw.items()
        if name in CONTROLS
        and isinstance(value, CONTROLS[name])
        and not (CONTROLS[name] is int and isinstance(value, bool))
    }
