"""The public API of ``conveyor`` is exactly what ``__all__`` lists, and nothing else slips in."""

from __future__ import annotations

import importlib.metadata

import conveyor

PUBLIC = [
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


def test_all_is_the_public_api() -> None:
    assert sorted(conveyor.__all__) == sorted(PUBLIC)


def test_every_exported_name_exists_and_nothing_public_is_left_out() -> None:
    for name in conveyor.__all__:
        assert hasattr(conveyor, name), name
    exposed = {
        name
        for name, value in vars(conveyor).items()
        if not name.startswith("_") and not isinstance(value, type(conveyor))
    }
    assert exposed <= set(conveyor.__all__), exposed - set(conveyor.__all__)


def test_the_version_is_the_package_metadata() -> None:
    assert conveyor.__version__ == importlib.metadata.version("conveyor")
