"""What a store can do, asked at run time: read off the protocols it implements.

Each capability is a protocol of ``conveyor.store.base`` (or the absence of
one), never a list kept by hand per store: a new store answers by what it
implements, and the answer cannot drift from what ``require`` lets through.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from conveyor.store.audit import AuditStore
from conveyor.store.base import (
    DurabilityReport,
    FlowControlStore,
    HoldStore,
    InsightStore,
    JobStore,
    LocalFileStore,
    OperatorStore,
    OutcomeStore,
    SqlStore,
    StepStore,
    TransactionalStore,
)

#: Each capability and the protocol it is read from.
PROTOCOLS: dict[str, type] = {
    "jobs": JobStore,
    "operations": OperatorStore,
    "insight": InsightStore,
    "limits": FlowControlStore,
    "caller_transactions": TransactionalStore,
    "spark": SqlStore,
    "durability_report": DurabilityReport,
    "outcome_readers": OutcomeStore,
    "hold": HoldStore,
    "steps": StepStore,
    "audit": AuditStore,
}


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What this App's store supports (``app.capabilities()``)."""

    #: The store, as its errors name it.
    store: str
    #: The core: enqueue, claim, leases, retries, groups, keys, batches, events,
    #: workers and ``consume`` (JobStore).
    jobs: bool
    #: Listings, counts, cancel, retry, purge, trim, hold, bulk actions, pause (OperatorStore).
    operations: bool
    #: The dashboard's figures, ``/metrics`` and the event feed (InsightStore).
    insight: bool
    #: Rate and concurrency limits and throttles (FlowControlStore).
    limits: bool
    #: ``enqueue(..., connection=conn)`` inside the caller's transaction (TransactionalStore).
    caller_transactions: bool
    #: The Spark data source: its writes stage rows in tables beside the jobs (SqlStore).
    spark: bool
    #: ``app.health()`` reports what persists the data (DurabilityReport: Redis).
    durability_report: bool
    #: ``app.unprocessed()`` and ``app.mark_processed()`` (OutcomeStore).
    outcome_readers: bool
    #: ``app.hold()`` and ``app.unhold()``: single queued jobs held back (HoldStore).
    hold: bool
    #: A job's durable steps, kept across its attempts (StepStore).
    steps: bool
    #: Operators' actions recorded and read back (AuditStore): the dashboard's
    #: Audit page and ``conveyor audit``.
    audit: bool
    #: Workers on several machines: every store but one file on this machine (LocalFileStore).
    several_machines: bool
    #: Other processes' changes wake this App's workers, consumers and waiters at
    #: once (LISTEN/NOTIFY, pub/sub, the file's data_version); False when the App
    #: runs poll-only (``notifications=False``).
    notifications: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_capabilities(store: object, notifications: bool = True) -> Capabilities:
    """The capabilities of ``store``, from the protocols it implements."""
    found = {name: isinstance(store, protocol) for name, protocol in PROTOCOLS.items()}
    return Capabilities(
        store=str(getattr(store, "description", type(store).__name__)),
        several_machines=found["jobs"] and not isinstance(store, LocalFileStore),
        notifications=found["jobs"] and notifications,
        **found,
    )
