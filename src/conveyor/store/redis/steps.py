"""StepStore on Redis: a job's durable steps (docs/effects.md)."""

from __future__ import annotations

import json
from datetime import datetime

from conveyor.store.records import Lease, NewStep, Step
from conveyor.store.redis.base import _dt, _now_arg, _ts
from conveyor.store.redis.core import CoreMixin


def _step_of(name: str, value: str) -> Step:
    """A step as step_record.lua keeps it: JSON [result, attempt, started_at, finished_at]."""
    result, attempt, started_at, finished_at = json.loads(value)
    return Step(name, result, int(attempt), _dt(started_at), _dt(finished_at))


class StepsMixin(CoreMixin):
    """Steps recorded under a lease, read by later attempts (``StepStore``)."""

    def step_list(self, job_id: int) -> list[Step]:
        found = self._do(lambda: self._client.hgetall(self._k("steps", str(job_id))))
        steps = [_step_of(str(name), value) for name, value in found.items()]
        return sorted(steps, key=lambda step: (step.finished_at, step.name))

    def step_record(self, lease: Lease, step: NewStep, now: datetime | None = None) -> Step | None:
        recorded_step = json.dumps([step.result_json, None, _ts(step.started_at), _now_arg(now)])
        recorded = self._run("step_record", str(lease.id), lease.token, step.name, recorded_step)
        return None if recorded is None else _step_of(step.name, recorded)
