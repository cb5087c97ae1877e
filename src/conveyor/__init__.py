"""conveyor: a durable job queue for Python on SQLite, PostgreSQL and Redis."""

import importlib as _importlib
import typing as _typing

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
from conveyor.version import __version__

if _typing.TYPE_CHECKING:
    from conveyor.app import App
    from conveyor.changes import Change
    from conveyor.context import CancelSignal, Context
    from conveyor.job import Event, Job, JobState, NewJob
    from conveyor.middleware import Middleware
    from conveyor.retry import ExponentialBackoff, FixedBackoff
    from conveyor.store.records import BatchStatus, LimitStatus, Stats, Step
    from conveyor.task import Task
    from conveyor.worker.retention import Keep
    from conveyor.workflow import Workflow, WorkflowRun, WorkflowStatus, chain, chord, group

# The rest is imported on first use: a process that needs one corner of the package
# (a Spark Python worker unpickling the data source, a hook script) does not pay
# for the App, the worker and the stores at start.
_HOME = {
    "App": "conveyor.app",
    "Change": "conveyor.changes",
    "CancelSignal": "conveyor.context",
    "Context": "conveyor.context",
    "Event": "conveyor.job",
    "Job": "conveyor.job",
    "JobState": "conveyor.job",
    "NewJob": "conveyor.job",
    "Middleware": "conveyor.middleware",
    "ExponentialBackoff": "conveyor.retry",
    "FixedBackoff": "conveyor.retry",
    "BatchStatus": "conveyor.store.records",
    "LimitStatus": "conveyor.store.records",
    "Stats": "conveyor.store.records",
    "Step": "conveyor.store.records",
    "Task": "conveyor.task",
    "Keep": "conveyor.worker.retention",
    "Workflow": "conveyor.workflow",
    "WorkflowRun": "conveyor.workflow",
    "WorkflowStatus": "conveyor.workflow",
    "chain": "conveyor.workflow",
    "chord": "conveyor.workflow",
    "group": "conveyor.workflow",
}


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value
    return value


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
