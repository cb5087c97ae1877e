"""conveyor: a durable job queue for Python on SQLite, PostgreSQL and Redis."""

from conveyor.app import App
from conveyor.changes import Change
from conveyor.context import CancelSignal, Context
from conveyor.errors import (
    ChildFailed,
    ConfigurationError,
    ConveyorError,
    EncryptedPayloadError,
    Fail,
    InvalidJobError,
    JobCancelled,
    JobFailed,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    Parked,
    Retry,
    SchemaMissingError,
    SignalTimeout,
    Sleeping,
    StoreUnavailableError,
    UnknownTaskError,
)
from conveyor.job import Event, Job, JobState, NewJob
from conveyor.middleware import Middleware
from conveyor.retry import ExponentialBackoff, FixedBackoff
from conveyor.store.records import BatchStatus, LimitStatus, Stats, Step
from conveyor.task import Task
from conveyor.version import __version__
from conveyor.worker.retention import Keep
from conveyor.workflow import Workflow, WorkflowRun, WorkflowStatus, chain, chord, group

__all__ = [
    "App",
    "BatchStatus",
    "CancelSignal",
    "Change",
    "ChildFailed",
    "ConfigurationError",
    "Context",
    "ConveyorError",
    "EncryptedPayloadError",
    "Event",
    "ExponentialBackoff",
    "Fail",
    "FixedBackoff",
    "InvalidJobError",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFoundError",
    "JobState",
    "JobStateError",
    "Keep",
    "LeaseLostError",
    "LimitStatus",
    "Middleware",
    "NewJob",
    "Parked",
    "Retry",
    "SchemaMissingError",
    "SignalTimeout",
    "Sleeping",
    "Stats",
    "Step",
    "StoreUnavailableError",
    "Task",
    "UnknownTaskError",
    "Workflow",
    "WorkflowRun",
    "WorkflowStatus",
    "__version__",
    "chain",
    "chord",
    "group",
]
