"""Declared workflows: a graph of jobs built first, then enqueued at once.

A ``Workflow`` is built from steps (``task.step(*args)``, a task with its
arguments and options, not yet enqueued); each node may wait only for nodes
added before it, so a graph built here has no cycle. ``chain``, ``group`` and
``chord`` build the common shapes. ``app.enqueue_workflow(wf)`` (or
``wf.enqueue()``) stores every job, its edges and the workflow's id in one
transaction (one script on Redis): all or nothing, and a second enqueue with
the same id returns the workflow already stored. See docs/workflows.md.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import MAX_JOB_ID, AfterFailure, Job, JobState, is_job_id, validate_name
from conveyor.store.records import WorkflowInfo
from conveyor.task import Step

__all__ = [
    "Node",
    "Step",
    "Workflow",
    "WorkflowInfo",
    "WorkflowRun",
    "WorkflowStatus",
    "chain",
    "chord",
    "group",
]


@dataclass(frozen=True, slots=True)
class Node:
    """A step added to a workflow: its place in the graph."""

    position: int
    step: Step
    #: Nodes of the same workflow it waits for (positions, all before its own).
    after: tuple[int, ...]
    #: Stored jobs it waits for (ids).
    after_jobs: tuple[int, ...]
    after_failure: AfterFailure


class Workflow:
    """A graph of steps to enqueue at once.

    ``id`` makes the enqueue idempotent: a workflow stored under it already is
    returned as it is (as a key does for a job). Without one, a new id is made.
    """

    def __init__(self, id: str | None = None, *, name: str | None = None) -> None:
        self.id: str = id if id is not None else uuid.uuid4().hex
        self.name: str = name if name is not None else self.id
        validate_name("workflow id", self.id)
        validate_name("workflow name", self.name)
        self.nodes: list[Node] = []

    def __repr__(self) -> str:
        return f"<Workflow {self.id} nodes={len(self.nodes)}>"

    def add(
        self,
        step: Step,
        *,
        after: Iterable[Node | Job | int] = (),
        after_failure: AfterFailure | None = None,
    ) -> Node:
        """Add a step that runs after ``after`` (nodes of this workflow, or stored jobs)."""
        if not isinstance(step, Step):
            raise InvalidJobError(
                f"a workflow takes steps (task.step(*args)), got {type(step).__name__}"
            )
        mine: list[int] = []
        jobs: list[int] = []
        for parent in list(after):
            if isinstance(parent, Node):
                if parent.position >= len(self.nodes) or self.nodes[parent.position] is not parent:
                    raise InvalidJobError(
                        f"{parent.step!r} is a node of another workflow; a node waits only for "
                        "nodes of its own workflow (or for stored jobs)"
                    )
                mine.append(parent.position)
            elif isinstance(parent, Job):
                jobs.append(parent.id)
            elif is_job_id(parent):
                jobs.append(parent)
            else:
                raise InvalidJobError(
                    "after must name nodes, Jobs or job ids "
                    f"(integers from 1 to {MAX_JOB_ID}), got {parent!r}"
                )
        failure = after_failure if after_failure is not None else step.options.after_failure
        if failure not in ("cancel", "run"):
            raise InvalidJobError(f"after_failure must be 'cancel' or 'run', got {failure!r}")
        node = Node(
            position=len(self.nodes),
            step=step,
            after=tuple(dict.fromkeys(mine)),
            after_jobs=tuple(dict.fromkeys(jobs)),
            after_failure=failure,
        )
        self.nodes.append(node)
        return node

    def chain(self, *steps: Step, after: Iterable[Node | Job | int] = ()) -> list[Node]:
        """Steps one after the other (the first after ``after``); returns their nodes."""
        nodes: list[Node] = []
        previous: Iterable[Node | Job | int] = after
        for step in steps:
            nodes.append(self.add(step, after=previous))
            previous = [nodes[-1]]
        return nodes

    def group(self, *steps: Step, after: Iterable[Node | Job | int] = ()) -> list[Node]:
        """Steps side by side, each after ``after``; returns their nodes."""
        parents = list(after)
        return [self.add(step, after=parents) for step in steps]

    def chord(
        self, header: Sequence[Step], callback: Step, *, after: Iterable[Node | Job | int] = ()
    ) -> Node:
        """A group, then ``callback`` after all of it (its ``ctx.upstream`` holds their results)."""
        return self.add(callback, after=self.group(*header, after=after))

    def enqueue(self) -> WorkflowRun:
        """Store the whole graph at once (see ``App.enqueue_workflow``)."""
        if not self.nodes:
            raise InvalidJobError(f"workflow {self.id!r} has no steps")
        app = self.nodes[0].step.task.app
        enqueue: Callable[[Workflow], WorkflowRun] = app.enqueue_workflow  # type: ignore[attr-defined]
        return enqueue(self)


def chain(*steps: Step, id: str | None = None, name: str | None = None) -> Workflow:
    """A workflow of steps one after the other: each reads the one before in ``ctx.upstream``."""
    wf = Workflow(id, name=name)
    wf.chain(*steps)
    return wf


def group(*steps: Step, id: str | None = None, name: str | None = None) -> Workflow:
    """A workflow of steps that run side by side."""
    wf = Workflow(id, name=name)
    wf.group(*steps)
    return wf


def chord(
    header: Sequence[Step], callback: Step, *, id: str | None = None, name: str | None = None
) -> Workflow:
    """A workflow of steps side by side, then ``callback`` after all of them."""
    wf = Workflow(id, name=name)
    wf.chord(header, callback)
    return wf


# --- a workflow once stored ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """How far a workflow has got: its jobs counted by state, read at one moment."""

    id: str
    counts: dict[str, int] = field(default_factory=dict)
    #: The first job of the workflow that failed (None: none did).
    failed_job: Job | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def outstanding(self) -> int:
        """Jobs that may still change: waiting, queued or running."""
        return sum(
            self.counts.get(s, 0) for s in (JobState.WAITING, JobState.QUEUED, JobState.RUNNING)
        )

    @property
    def finished(self) -> bool:
        """Every job of the workflow has ended."""
        return self.total > 0 and self.outstanding == 0

    @property
    def succeeded(self) -> bool:
        """Every job of the workflow succeeded."""
        return self.total > 0 and self.counts.get(JobState.SUCCEEDED, 0) == self.total


class WorkflowSource(Protocol):
    """What a WorkflowRun reads and acts through: the App it came from."""

    def workflow_status(self, workflow_id: str) -> WorkflowStatus: ...

    def cancel_workflow(self, workflow_id: str) -> int: ...


@dataclass
class WorkflowRun:
    """A workflow as stored: its jobs in the order of its nodes, and ways to follow it."""

    id: str
    name: str
    jobs: list[Job]
    #: True when the id was taken already and this is the workflow stored then.
    existing: bool
    _app: WorkflowSource = field(repr=False)

    def status(self) -> WorkflowStatus:
        """Its jobs counted by state now, and the first that failed."""
        return self._app.workflow_status(self.id)

    def wait(self, timeout: float | None = None, *, interval: float = 0.05) -> WorkflowStatus:
        """Block until every job of the workflow has ended; return its status.

        Raises TimeoutError after ``timeout`` seconds. Looks at the counts now
        and then (from every ``interval`` seconds, growing to one second).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = interval
        while True:
            status = self.status()
            if status.finished or status.total == 0:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"workflow {self.id!r} has {status.outstanding} jobs still to end "
                    f"after {timeout}s"
                )
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 1.5, 1.0)

    def cancel(self) -> int:
        """Cancel every job of the workflow that has not ended; returns how many changed."""
        return self._app.cancel_workflow(self.id)


def check_workflow(wf: object) -> Workflow:
    if not isinstance(wf, Workflow):
        raise ConfigurationError(f"enqueue_workflow takes a Workflow, got {type(wf).__name__}")
    if not wf.nodes:
        raise InvalidJobError(f"workflow {wf.id!r} has no steps")
    return wf
