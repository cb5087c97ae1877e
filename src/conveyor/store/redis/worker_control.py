"""What an operator asks of a worker, on Redis (conveyor.store.worker_control):
``scripts/worker_control.lua`` merges it into the worker's hash."""

from __future__ import annotations

from conveyor.store.redis.base import RedisBase


class RedisWorkerControl(RedisBase):
    """WorkerControlStore for the redis store."""

    def worker_control(self, worker_id: str, changes: str) -> str | None:
        control = self._run("worker_control", worker_id, changes)
        return None if control is None else str(control)
