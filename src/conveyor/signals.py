"""Sending a signal to a job (``app.signal``), and reading what a parked job waits for.

The store keeps the signal and wakes a job parked waiting for it in one
transaction (``SignalStore.signal_send``); this module checks what it is given
and says why a signal was refused: an unknown job, or one that has finished
and so will never take it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from conveyor.errors import JobNotFoundError, JobStateError
from conveyor.job import Job, encode_json, utcnow, validate_name
from conveyor.store.capabilities import signal_store
from conveyor.store.records import Stats, Step
from conveyor.store.signals import Signal, SignalStore, Waiting


def send(store: object, job_id: int, name: str, payload: Any = None) -> bool:
    """Send signal ``name`` with ``payload`` (JSON) to job ``job_id``; whether it woke the job.

    Raises ``JobNotFoundError`` for an unknown job and ``JobStateError`` for a
    finished one (nothing is kept for it), ``InvalidJobError`` for a bad name or
    a payload JSON cannot carry.
    """
    validate_name("signal name", name)
    payload_json = encode_json(f"the payload of signal {name!r}", payload)
    sent = signal_store(store, "send signals").signal_send(job_id, name, payload_json, utcnow())
    if sent.state is None:
        raise JobNotFoundError(f"no job with id {job_id}: signal {name!r} was not sent")
    if not sent.kept:
        raise JobStateError(
            f"job {job_id} has finished ({sent.state}) and will take no signal: "
            f"signal {name!r} was not sent"
        )
    return sent.woken


def wake(durable: SignalStore | None, job_id: int, get: Callable[[int], Job]) -> None:
    """Wake a parked job early (an operator's act): its wait ends now and it is due now.

    A sleep is over, a wait for a signal times out (``SignalTimeout`` in the
    handler), a wait for children looks again. ``durable`` is the App's port
    (``app.durable``), ``get`` reads a job (``app.get``: ``JobNotFoundError`` for an
    unknown one); ``JobStateError`` for a job that no wait parks.
    """
    if signal_store(durable, "wake parked jobs").wait_wake(job_id, utcnow()):
        return
    job = get(job_id)
    raise JobStateError(
        f"job {job_id} is {job.detailed_state()}, not parked by a sleep or a wait: nothing to wake"
    )


def waiting(store: object, job_id: int) -> Waiting | None:
    """What job ``job_id`` waits for (a signal, children, until when), when a wait parked it."""
    return signal_store(store, "read what a job waits for").job_waiting(job_id)


def with_parked(store: object, stats: Stats, now: datetime) -> Stats:
    """``stats`` with each queue's parked jobs counted (``QueueStats.parked``), read
    from the store's waits: on a store without signals, unchanged."""
    if not isinstance(store, SignalStore):
        return stats
    parked = store.parked_counts(now)
    queues = {name: replace(q, parked=parked.get(name, 0)) for name, q in stats.queues.items()}
    return replace(stats, queues=queues)


def signals(store: object, job_id: int) -> list[Signal]:
    """The signals sent to job ``job_id``, taken or not, in the order they were sent."""
    return signal_store(store, "read a job's signals").signal_list(job_id)


def spawned(steps: list[Step]) -> list[int]:
    """The ids of the children a job spawned (``ctx.spawn``), read off its ``spawn-N`` steps."""
    found = []
    for step in steps:
        number = step.name.removeprefix("spawn-")
        if number != step.name and number.isdigit() and isinstance(step.result, int):
            found.append((int(number), step.result))
    return [child for _, child in sorted(found)]
