"""The Redis store's retry of a workflow from its failures: one script
(scripts/workflow_retry.lua; the rule is conveyor.store.workflow_retry's)."""

from __future__ import annotations

from datetime import datetime

from conveyor.store.redis.base import RedisBase
from conveyor.store.workflow_retry import key_taken


class RedisWorkflowRetry(RedisBase):
    """Mixed into RedisStore, whose ``_run`` runs its script."""

    def workflow_retry(self, workflow_id: str, now: datetime) -> list[int]:
        ids = self._run("workflow_retry", workflow_id, f"{now.timestamp():.6f}")
        if ids is None:  # the script's false: a key another live job holds
            raise key_taken(workflow_id)
        return sorted(int(i) for i in ids)
