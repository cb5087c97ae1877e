"""Rewriting stored payloads in place: what re-encrypting jobs under a new key needs.

A capability beside the core (see store/base.py): each store has it as one mixin
(``store/<backend>/payloads.py``). A page of payloads is read by id, and each
value is written back only while it still holds what was read, decided in the
store's statement or script: a worker that records a result meanwhile, or a
retry, is never undone by a rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

#: The values of a job that may be rewritten: its arguments, its result and its
#: durable steps' results (a step is named by ``PayloadChange.step``).
PayloadField = Literal["args", "kwargs", "result", "step"]


@dataclass(frozen=True, slots=True)
class StoredPayload:
    """A job's stored values, as text: clear JSON or sealed (conveyor.encryption)."""

    id: int
    args: str
    kwargs: str
    result: str | None
    #: (name, result) of each durable step.
    steps: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PayloadChange:
    """One stored value to replace, only while it still holds ``old``."""

    id: int
    field: PayloadField
    old: str
    new: str
    #: The step's name, for ``field="step"``.
    step: str | None = None


@runtime_checkable
class PayloadStore(Protocol):
    """Reads jobs' payloads page by page and rewrites chosen values of them."""

    def payload_page(self, after_id: int, limit: int) -> tuple[list[StoredPayload], int | None]:
        """Payloads of the jobs of ids above ``after_id``, at most ``limit`` ids on,
        in id order; and the id to go on after, None once past the newest job."""
        ...

    def payload_rewrite(self, changes: Sequence[PayloadChange]) -> int:
        """Write the changes whose value still holds ``old``, in one transaction;
        how many were written."""
        ...
