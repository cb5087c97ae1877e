"""A small core protocol and capabilities beside it, checked up front.

Every store implements the core (``JobStore``) and, today, every capability
but the optional ones; a store with only the core runs workers and consumers,
and whatever needs more is refused before anything is written, naming what
is missing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conveyor import App, ConfigurationError, JobState
from conveyor.store import capabilities
from conveyor.store.dsn import open_store
from conveyor.store.protocols import (
    DurabilityReport,
    FlowControlStore,
    InsightStore,
    JobStore,
    OperatorStore,
    Store,
    TransactionalStore,
)

CORE = frozenset(name for name in dir(JobStore) if not name.startswith("_")) | {"description"}


class CoreOnly:
    """A real store seen through the core protocol only: nothing else can be reached."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.description = f"core of {inner.description}"

    def __getattr__(self, name: str) -> Any:
        if name in CORE:
            return getattr(self._inner, name)
        raise AttributeError(f"{name} is not part of the core")


def test_every_store_has_every_capability_it_claims(dsn: str) -> None:
    store = open_store(dsn)
    try:
        for capability in (JobStore, OperatorStore, InsightStore, FlowControlStore, Store):
            assert isinstance(store, capability), capability.__name__
        redis = dsn.startswith("redis")
        assert isinstance(store, TransactionalStore) is not redis
        assert isinstance(store, DurabilityReport) is redis
    finally:
        store.close()


def test_a_store_with_only_the_core_runs_workers_and_refuses_the_rest(tmp_path: Path) -> None:
    inner = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    inner.migrate()
    core = CoreOnly(inner)
    assert isinstance(core, JobStore) and not isinstance(core, OperatorStore)
    with App(store=core) as app:

        @app.task
        def double(n: int) -> int:
            return 2 * n

        job = double.enqueue(21)
        with app.worker(concurrency=1, poll_interval=0.1, lease=2):
            assert app.wait(job.id, timeout=20) == 42
        assert app.get(job.id).state == JobState.SUCCEEDED
        for held in app.consume(["default"], idle_timeout=0.2):
            raise AssertionError(f"nothing was left to consume, got {held}")

        refusals = {
            "list jobs": lambda: app.jobs(),
            "cancel jobs": lambda: app.cancel(job.id),
            "count jobs": lambda: app.stats(),
            "set limits": lambda: app.limit("default", "10/s"),
            "throttle queues": lambda: app.throttle("default", 5),
        }
        for what, call in refusals.items():
            with pytest.raises(ConfigurationError, match=f"cannot {what}: it does not implement"):
                call()
        conn = sqlite3.connect(tmp_path / "jobs.db")
        try:
            with pytest.raises(ConfigurationError, match="implement TransactionalStore"):
                double.options(connection=conn).enqueue(1)
        finally:
            conn.close()
        # Refused up front: nothing was written.
        assert [j.id for j in inner.job_get_many([1, 2, 3])] == [job.id]
    inner.close()


def test_redis_refuses_a_callers_transaction_up_front(redis_clean_dsn: str) -> None:
    with App(redis_clean_dsn) as app:
        app.migrate()

        @app.task
        def hello() -> None:
            return None

        refused = "cannot enqueue inside a caller's transaction"
        with pytest.raises(ConfigurationError, match=refused):
            hello.options(connection=object()).enqueue()
        assert app.jobs() == []


def test_a_capability_check_returns_the_store_narrowed_or_refuses_it(
    dsn: str, store: Store
) -> None:
    # Granted: the very store comes back, typed as the capability.
    assert capabilities.operator_store(store, "list jobs") is store
    assert capabilities.hold_store(store, "hold jobs").job_held(None, None, 10) == []
    redis = dsn.startswith("redis")
    if redis:
        assert capabilities.durability_report(store, "report durability") is store
        with pytest.raises(ConfigurationError) as refused:
            capabilities.sql_store(store, "stage Spark writes")
        assert str(refused.value) == (
            f"{store.description} cannot stage Spark writes: it does not implement SqlStore"
        )
    else:
        assert capabilities.sql_store(store, "stage Spark writes") is store
        with pytest.raises(ConfigurationError, match="does not implement DurabilityReport"):
            capabilities.durability_report(store, "report durability")


def test_every_capability_check_refuses_a_store_with_only_the_core(tmp_path: Path) -> None:
    inner = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    core = CoreOnly(inner)
    checks = {
        capabilities.operator_store: "OperatorStore",
        capabilities.insight_store: "InsightStore",
        capabilities.flow_control_store: "FlowControlStore",
        capabilities.transactional_store: "TransactionalStore",
        capabilities.durability_report: "DurabilityReport",
        capabilities.workflow_store: "WorkflowStore",
        capabilities.hold_store: "HoldStore",
        capabilities.outcome_store: "OutcomeStore",
        capabilities.sql_store: "SqlStore",
        capabilities.local_file_store: "LocalFileStore",
        capabilities.step_store: "StepStore",
        capabilities.transactional_completion: "TransactionalCompletion",
    }
    try:
        for check, protocol in checks.items():
            with pytest.raises(ConfigurationError) as refused:
                check(core, "do this")
            expected = (
                f"core of {inner.description} cannot do this: it does not implement {protocol}"
            )
            assert str(refused.value) == expected
            # The same store passes the same check unwrapped, or is refused for real.
            if protocol != "DurabilityReport":
                assert check(inner, "do this") is inner
    finally:
        inner.close()
