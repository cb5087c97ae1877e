"""conveyor: a durable job queue for Python on SQLite and PostgreSQL."""

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
from conveyor.middleware import Middleware
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
    "Middleware",
    "Retry",
    "SchemaMissingError",
    "StoreUnavailableError",
    "Task",
    "UnknownTaskError",
    "__version__",
]
