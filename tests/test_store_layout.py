"""Each store finds a capability's implementation in one module: its mixin for that protocol."""

from __future__ import annotations

import inspect

import pytest

from conveyor.store.capabilities import PROTOCOLS
from conveyor.store.postgres import PostgresStore
from conveyor.store.protocols import HoldStore, JobStore
from conveyor.store.redis import RedisStore
from conveyor.store.sqlite import SQLiteStore

STORES = [PostgresStore, SQLiteStore, RedisStore]


def _methods(protocol: type) -> list[str]:
    return [
        name
        for name, member in vars(protocol).items()
        if not name.startswith("_") and inspect.isfunction(member)
    ]


def _module_of(store: type, name: str) -> str:
    """The module that defines the store's method ``name`` (as wrapped by store/boundary.py,
    which keeps the module of the method it wraps)."""
    module: str = inspect.getattr_static(store, name).__module__
    return module.rsplit(".", 1)[-1]


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.__name__)
def test_each_capability_is_implemented_in_one_module_of_each_store(store: type) -> None:
    seen = {}
    for capability, protocol in PROTOCOLS.items():
        names = _methods(protocol)
        if not names or not all(hasattr(store, name) for name in names):
            continue
        modules = {_module_of(store, name) for name in names}
        if protocol is JobStore:
            # The core's plumbing (migrate, close, ping...) is the base every mixin shares,
            # and job_claim is the one every store shares (store/claims.py): it asks the
            # store's _claim, which the fair turns' mixin answers first for fair queues
            # (the others go on to the core's).
            modules -= {"base", "claims"}
            assert _module_of(store, "job_claim") == "claims"
            assert _module_of(store, "_claim") == "fair"
        if protocol is HoldStore:
            # Hold and let go are one operation by name, written once (store/holding.py)
            # over each store's own _hold; the rest of the capability is the store's.
            modules -= {"holding"}
            assert {_module_of(store, n) for n in ("job_hold", "job_unhold")} == {"holding"}
            assert _module_of(store, "_hold") == "holds"
        assert len(modules) == 1, (capability, modules)
        seen[capability] = modules
    # A store is only split if its capabilities sit in different modules.
    assert len(set().union(*seen.values())) >= 6, seen


def test_the_archives_delete_is_for_sql_stores_only() -> None:
    assert not hasattr(RedisStore, "job_delete_terminal")
    assert hasattr(PostgresStore, "job_delete_terminal")
    assert hasattr(SQLiteStore, "job_delete_terminal")
