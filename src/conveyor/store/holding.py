"""What the three stores' ``HoldStore`` share: holding and letting go are one
operation each store runs by name (a statement or a script), with nothing to do
for no ids."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


class HoldByName:
    """``job_hold`` and ``job_unhold`` on a store's ``_hold``, which runs the
    operation of that name ("job_hold" or "job_unhold") on ids it is given."""

    def job_hold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_hold", job_ids, now) if job_ids else []

    def job_unhold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_unhold", job_ids, now) if job_ids else []

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        """The ids among ``job_ids`` (never empty) that the operation changed, in order."""
        raise NotImplementedError
