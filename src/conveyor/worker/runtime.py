"""What workers, consumers, inline mode and maintenance run on: the ports an App hands them.

The runtime never sees the App: it gets the store (used through the
protocols each part needs, checked where a capability is beyond the core),
a read-only view of the registered tasks, the change feed, the middleware,
the periodic tasks and the retention policy. The App builds one
(``app.runtime``) and is the facade for everything else.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.changes import ChangeHub
from conveyor.encryption import PayloadCodec
from conveyor.errors import SchemaMissingError
from conveyor.job import Job
from conveyor.middleware import Middleware
from conveyor.schedule import Periodic
from conveyor.store.capabilities import flow_control_store
from conveyor.store.protocols import DurabilityReport, FlowControlStore, JobStore, WorkflowStore
from conveyor.store.records import Relative
from conveyor.task import Task
from conveyor.worker.retention import Retention


@dataclass(frozen=True, eq=False)
class Runtime:
    #: The store; the core (JobStore) always, any other capability checked where used.
    store: JobStore
    #: The registered tasks by name: a live, read-only view of the App's registry.
    tasks: Mapping[str, Task[Any, Any]]
    #: This process's change feed: local enqueues and outcomes, and the store's.
    changes: ChangeHub
    #: The middleware around each attempt, as installed now.
    middleware: Callable[[], tuple[Middleware, ...]]
    #: The periodic tasks (a live view: registered ones appear in the next round).
    periodic: Sequence[Periodic] = ()
    retention: Retention = field(default_factory=Retention)
    #: Gives a job read from the store its way back to the App (``job.wait()``...).
    attach: Callable[[Job], Job] = lambda job: job
    #: Seals results and steps' results, opens claimed jobs; None: stored clear.
    codec: PayloadCodec | None = None
    #: Open pull loops (``consume``): closed, releasing what they hold, with the App.
    consumers: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)

    def check_schema(self) -> int:
        """Raise SchemaMissingError unless the database has this code's schema; its version.

        The CLI, the dashboard and the worker call it before anything else, so a
        database that was never migrated says "run conveyor migrate" instead of
        "no such table".
        """
        store = self.store
        version, latest = store.schema_version(), store.schema_latest()
        if version == 0:
            raise SchemaMissingError(
                f"{store.description} has no conveyor tables: "
                "run `conveyor migrate` on it (with the same --dsn), or app.migrate(), first"
            )
        if version < latest:
            raise SchemaMissingError(
                f"{store.description} is at schema version {version} and this conveyor "
                f"needs {latest}: run `conveyor migrate` on it (with the same --dsn)"
            )
        return version

    def health(self) -> dict[str, Any]:
        """Whether the store answers, how fast, and its schema version. Never raises."""
        store = self.store
        started = time.perf_counter()
        try:
            store.ping()
            version = self.check_schema()
        except Exception as exc:
            return {"ok": False, "store": store.description, "error": str(exc)}
        health: dict[str, Any] = {
            "ok": True,
            "store": store.description,
            "schema_version": version,
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
        }
        # Stores whose durability depends on the server's settings (Redis) say so.
        if isinstance(store, DurabilityReport):
            try:
                health["persistence"], warning = store.durability()
            except Exception as exc:
                health["persistence"], warning = "unknown", f"cannot read persistence: {exc}"
            if warning is not None:
                health["warning"] = warning
        return health

    def parent_edges(self, job_id: int) -> list[Relative]:
        """The edges onto the jobs ``job_id`` waits (or waited) for, by parent id."""
        store = self.store
        if not isinstance(store, WorkflowStore):
            return []  # a store without workflows has no job that waits for another
        edges = store.job_parents(job_id)
        for edge in edges:
            if edge.job is not None:
                self.attach(edge.job)
        return edges

    def throttle(self, queue: str, seconds: float, limit_key: str | None) -> datetime:
        """Hold back every ready job of ``queue`` (or of ``limit_key`` in it); when it ends."""
        return flow_control_store(self.store, "throttle queues").limit_throttle(
            queue, limit_key, seconds
        )

    def limited(self, queues: Sequence[str]) -> bool:
        """Whether any of ``queues`` has a limit (inline mode then claims as a worker would)."""
        store = self.store
        return isinstance(store, FlowControlStore) and any(
            store.limit_get(queue) is not None for queue in queues
        )
