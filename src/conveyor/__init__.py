"""conveyor: a durable job queue for Python on SQLite, PostgreSQL or Redis."""

from conveyor.app import App
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    Fail,
    InvalidJobError,
    JobCancelled,
    JobFailed,
    JobNotFoundError,
    JobStateError,
    LeaseLostError,
    Retry,
    SchemaMissingError,
    StoreUnavailableError,
    UnknownTaskError,
)
from conveyor.job import Event, Job, JobState
from conveyor.retry import ExponentialBackoff, FixedBackoff
from conveyor.task import Task
from conveyor.version import __version__

__all__ = [
    "App",
    "ConfigurationError",
    "ConveyorError",
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
    "LeaseLostError",
    "Retry",
    "SchemaMissingError",
    "StoreUnavailableError",
    "Task",
    "UnknownTaskError",
    "__version__",
]
