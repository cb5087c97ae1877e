"""A finish that claims the next jobs in the same call: one round trip where a finish
and a claim took two.

A worker that records outcomes frees as many slots; a store with this
capability (Redis: the finish script claims by the claim's own rule) fills
them in the same call, under a fresh lease, and hands the jobs back with the
finish's answer. The worker passes how many it has room for; a store without
it finishes, and the worker claims as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

from conveyor.job import Job
from conveyor.store.records import Finish


@dataclass(frozen=True, slots=True)
class FetchNext:
    """What to claim after the outcomes: ``job_claim``'s arguments (no group)."""

    queues: tuple[str, ...]
    #: The most jobs to claim; 0 claims none.
    limit: int
    worker: str
    lease: timedelta


@runtime_checkable
class FinishFetchStore(Protocol):
    def job_finish_fetch(
        self, finishes: Sequence[Finish], fetch: FetchNext
    ) -> tuple[list[int], list[Job]]:
        """``job_finish``, then ``job_claim`` as ``fetch`` asks, as one atomic step:
        the ids changed, and the jobs claimed (in claim order)."""
        ...
