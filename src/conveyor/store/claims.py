"""The claim every store shares: ``job_claim`` checked once, its question made a
frozen record (ClaimAsk) and handed to the store's ``_claim``.

A store's core answers ``_claim`` with its plain claim; a capability that claims
some queues its own way (fair turns, ``store/fair.py``) overrides ``_claim``,
takes its queues and hands the rest on with ``ask.part``. So the long signature
of ``job_claim`` is written once, here and in the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from conveyor.job import Job


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """One claim's question: see JobStore.job_claim."""

    #: The queues asked, each once, in the order asked.
    queues: tuple[str, ...]
    limit: int
    worker: str
    lease: timedelta
    now: datetime | None
    group: str | None

    def part(self, queues: Sequence[str], limit: int) -> ClaimAsk:
        """The same claim of some of the queues, for at most ``limit`` jobs."""
        return replace(self, queues=tuple(queues), limit=limit)


class ClaimEntry:
    """``job_claim`` of every store: bad asks answered empty, the rest to ``_claim``."""

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
        # A queue named twice is searched once (and its jobs not counted twice).
        names = tuple(dict.fromkeys(queues))
        return self._claim(ClaimAsk(names, limit, worker, lease, now, group))

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        """Up to ``ask.limit`` jobs of ``ask.queues`` (the store's core claims them)."""
        raise NotImplementedError
