"""What a store can do, asked at run time: read off the protocols it implements.

Each capability is a protocol of ``conveyor.store.protocols`` (or the absence
of one), never a list kept by hand per store: a new store answers by what it
implements, and the answer cannot drift from what ``require`` lets through.

Callers that go on to use a capability ask for the store as that protocol, and
get it narrowed, or the error that names what is missing::

    hold_store(app.store, "hold jobs").job_hold(ids, now)

One small function per protocol: mypy refuses a protocol class where a
``type[T]`` is expected (it cannot be instantiated), so a single generic
``require(store, OperatorStore, ...) -> OperatorStore`` cannot be typed; each
function's ``isinstance`` narrows the store for real, with no cast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from conveyor.errors import ConfigurationError
from conveyor.store.audit import AuditStore
from conveyor.store.payloads import PayloadStore
from conveyor.store.protocols import (
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
    TransactionalCompletion,
    TransactionalStore,
    WorkflowStore,
)
from conveyor.store.signals import SignalStore
from conveyor.store.worker_control import WorkerControlStore
from conveyor.store.workflow_retry import WorkflowRetryStore

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


def refuse(store: object, capability: type, what: str) -> NoReturn:
    """Raise ConfigurationError: ``store`` cannot do ``what`` without ``capability``."""
    description = getattr(store, "description", type(store).__name__)
    raise ConfigurationError(
        f"{description} cannot {what}: it does not implement {capability.__name__}"
    )


def require(store: object, capability: type, what: str) -> None:
    """Refuse (``refuse``) a store that does not implement ``capability``.

    Called up front, before anything is written, by the App, the CLI, the
    dashboard and the extras for whatever is not in the core (``JobStore``).
    The functions below do the same and return the store as the capability.
    """
    if not isinstance(store, capability):
        refuse(store, capability, what)


# The store as each capability, narrowed, or refused saying what it cannot do.


def operator_store(store: object, what: str) -> OperatorStore:
    if isinstance(store, OperatorStore):
        return store
    refuse(store, OperatorStore, what)


def insight_store(store: object, what: str) -> InsightStore:
    if isinstance(store, InsightStore):
        return store
    refuse(store, InsightStore, what)


def flow_control_store(store: object, what: str) -> FlowControlStore:
    if isinstance(store, FlowControlStore):
        return store
    refuse(store, FlowControlStore, what)


def transactional_store(store: object, what: str) -> TransactionalStore:
    if isinstance(store, TransactionalStore):
        return store
    refuse(store, TransactionalStore, what)


def durability_report(store: object, what: str) -> DurabilityReport:
    if isinstance(store, DurabilityReport):
        return store
    refuse(store, DurabilityReport, what)


def workflow_store(store: object, what: str) -> WorkflowStore:
    if isinstance(store, WorkflowStore):
        return store
    refuse(store, WorkflowStore, what)


def hold_store(store: object, what: str) -> HoldStore:
    if isinstance(store, HoldStore):
        return store
    refuse(store, HoldStore, what)


def outcome_store(store: object, what: str) -> OutcomeStore:
    if isinstance(store, OutcomeStore):
        return store
    refuse(store, OutcomeStore, what)


def sql_store(store: object, what: str) -> SqlStore:
    if isinstance(store, SqlStore):
        return store
    refuse(store, SqlStore, what)


def local_file_store(store: object, what: str) -> LocalFileStore:
    if isinstance(store, LocalFileStore):
        return store
    refuse(store, LocalFileStore, what)


def step_store(store: object, what: str) -> StepStore:
    if isinstance(store, StepStore):
        return store
    refuse(store, StepStore, what)


def transactional_completion(store: object, what: str) -> TransactionalCompletion:
    if isinstance(store, TransactionalCompletion):
        return store
    refuse(store, TransactionalCompletion, what)


def payload_store(store: object, what: str) -> PayloadStore:
    if isinstance(store, PayloadStore):
        return store
    refuse(store, PayloadStore, what)


def workflow_retry_store(store: object, what: str) -> WorkflowRetryStore:
    if isinstance(store, WorkflowRetryStore):
        return store
    refuse(store, WorkflowRetryStore, what)


def worker_control_store(store: object, what: str) -> WorkerControlStore:
    if isinstance(store, WorkerControlStore):
        return store
    refuse(store, WorkerControlStore, what)


def signal_store(store: object, what: str) -> SignalStore:
    if isinstance(store, SignalStore):
        return store
    refuse(store, SignalStore, what)
