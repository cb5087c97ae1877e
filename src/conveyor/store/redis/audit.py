"""The Redis store's audit (conveyor.store.audit): a capped list, newest first.

``audit_record.lua`` pushes each entry with the next id and trims the list to
the newest ``REDIS_KEPT`` entries, so the audit never grows past that bound.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from conveyor.store.audit import REDIS_KEPT, AuditAction, AuditEntry
from conveyor.store.redis.base import RedisBase


class RedisAudit(RedisBase):
    """AuditStore for RedisStore (one of its base classes: uses its ``_run``)."""

    def audit_record(self, action: AuditAction, at: datetime) -> None:
        entry = {"at": at.timestamp(), **action.kept()}
        self._run("audit_record", json.dumps(entry), str(REDIS_KEPT))

    def audit_list(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        if before is not None and before <= 1:
            return []
        rows = self._run("audit_list", str(limit), "" if before is None else str(before))
        entries = []
        for text in rows:
            data = json.loads(text)
            entries.append(
                AuditEntry(
                    id=int(data["id"]),
                    at=datetime.fromtimestamp(float(data["at"]), UTC),
                    actor=str(data["actor"]),
                    source=str(data["source"]),
                    action=str(data["action"]),
                    target=str(data["target"]),
                    jobs=None if data.get("jobs") is None else int(data["jobs"]),
                )
            )
        return entries
