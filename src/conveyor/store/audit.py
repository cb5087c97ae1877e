"""The audit: a record of operators' actions (who, what, when, how many jobs), kept in the store.

Every dashboard and every ``conveyor`` command on one store writes and reads
the same record. Only operators' actions are recorded (retry, cancel, purge,
pause, limits, ...): a job's own life (enqueue, claim, finish) writes nothing
here. The SQL stores keep every entry; Redis keeps the newest ``REDIS_KEPT``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

#: Entries the Redis store keeps (a capped list): the oldest go first.
REDIS_KEPT = 10_000
#: The longest text an entry keeps of each field (a name is data of any length).
FIELD_CHARS = 500


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator's action."""

    #: Increasing: newer entries have larger ids (``before`` pages by it).
    id: int
    at: datetime
    #: Who: a user, "admin token", "read token", "local", or the CLI's user@host.
    actor: str
    #: Where from: "dashboard" or "cli".
    source: str
    #: What: "retry", "cancel", "purge", "pause", "limit set", ...
    action: str
    #: On what: "job 12", "queue mail", "jobs state=failed&queue=mail", ...
    target: str
    #: Jobs changed, when the action counts them.
    jobs: int | None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


@dataclass(frozen=True, slots=True)
class AuditAction:
    """An action to record: an entry before the store gives it an id (see ``AuditEntry``)."""

    actor: str
    source: str
    action: str
    target: str
    jobs: int | None = None

    def kept(self) -> dict[str, Any]:
        """The fields as an entry keeps them: each text clipped to FIELD_CHARS."""
        return {
            "actor": clip(self.actor),
            "source": clip(self.source),
            "action": clip(self.action),
            "target": clip(self.target),
            "jobs": self.jobs,
        }


@runtime_checkable
class AuditStore(Protocol):
    """Recording operators' actions and reading them back, newest first."""

    def audit_record(self, action: AuditAction, at: datetime) -> None:
        """Add one entry: ``action``, done ``at``."""
        ...

    def audit_list(self, limit: int, before: int | None = None) -> list[AuditEntry]:
        """The newest ``limit`` entries (with ids below ``before``), newest first."""
        ...


def clip(text: str) -> str:
    """A field as kept: at most FIELD_CHARS characters."""
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 1] + "…"
