"""A workflow run again from its failures: the capability, and what the stores share.

Beside ``WorkflowStore``: ``workflow_retry`` puts the workflow's failed jobs,
and the jobs their failure cancelled, back as new; the jobs that succeeded keep
their results. Each store decides which jobs in its own statement (PostgreSQL),
write transaction (SQLite) or script (Redis): ``workflow_retry`` in the
store's ``workflow_retry.sql`` or ``scripts/workflow_retry.lua``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from conveyor.errors import JobStateError


@runtime_checkable
class WorkflowRetryStore(Protocol):
    def workflow_retry(self, workflow_id: str, now: datetime) -> list[int]:
        """Run the workflow again from its failures; the ids put back, ascending.

        Its failed jobs, and the cancelled jobs their failure reached (children
        through edges that resolved failed or cancelled, and theirs in turn), go
        back as new: attempts reset, error and result cleared, a
        ``manual_retry`` event. One whose parent runs again waits for it (its
        edges from the jobs put back resolve again); the others are queued.
        Raises JobStateError, and changes nothing, when one of them has a key
        that another live job holds now.
        """
        ...


def key_taken(workflow_id: str) -> JobStateError:
    """The refusal of a retry that would give a key two live jobs."""
    return JobStateError(
        f"workflow {workflow_id!r} was not retried: a job of it to run again has a key "
        "that another live job holds now (cancel or finish that job first)"
    )
