"""The public API of ``conveyor`` is exactly what ``__all__`` lists, and nothing else slips in."""

from __future__ import annotations

import importlib.metadata

import conveyor

PUBLIC = [
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
    "Sleeping",
    "SchemaMissingError",
    "SignalTimeout",
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


#: Public App methods with no async twin, and why.
NO_TWIN = {
    "close": "closing is immediate and must also run outside an event loop",
    "set_inline": "a switch for tests, no I/O",
    "task": "a decorator, no I/O",
    "periodic": "a decorator, no I/O",
    "worker": "builds a Worker; its run() blocks by design",
    "run_worker": "blocks until the worker stops by design",
    "consume": "aconsume is its own async iterator",
    "aconsume": "the async iterator itself",
    "get_task": "a lookup in this process, no I/O",
    "enqueue_calls": "the building block of enqueue; aenqueue covers it",
    "wait": "await_result is its asyncio form (it waits on a notification, not a thread)",
    "await_result": "the asyncio form of wait",
    "migrate": "run once at deploy time, from a script or the CLI",
    "check_schema": "called once at start by the worker, the CLI and the dashboard",
    "apply_retention": "maintenance runs it in its own thread",
    "middleware_chain": "a lookup in this process, no I/O",
    "on_change": "registers a callback in this process, no I/O",
    "task_schema": "reads the handler's annotations in this process, no I/O",
    "port": "the store seen as one of its capabilities, no I/O",
}


def test_every_public_app_method_has_an_async_twin_with_the_same_parameters() -> None:
    import inspect

    from conveyor import App

    public = {
        name: member
        for name, member in inspect.getmembers(App, inspect.isfunction)
        if not name.startswith("_")
    }
    twins = {name for name in public if name.startswith("a") and name[1:] in public}
    missing = []
    for name, method in sorted(public.items()):
        if name in twins or name in NO_TWIN:
            continue
        twin = public.get(f"a{name}")
        if twin is None:
            missing.append(name)
            continue
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin) == inspect.signature(method), name
    assert missing == [], f"public App methods without an async twin: {missing}"
    assert set(NO_TWIN) <= set(public), set(NO_TWIN) - set(public)
