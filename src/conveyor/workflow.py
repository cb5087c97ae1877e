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

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeAlias

from conveyor.enqueueing import new_jobs_of
from conveyor.errors import ConfigurationError, InvalidJobError
from conveyor.job import (
    MAX_JOB_ID,
    AfterFailure,
    Job,
    JobState,
    NewJob,
    is_job_id,
    utcnow,
    validate_name,
)
from conveyor.store.protocols import JobStore
from conveyor.store.records import WorkflowInfo
from conveyor.task import Step, Task

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


#: The job header a node's label is stored under (``wf.add(step, label=...)``): the
#: dashboard's graph shows it instead of the task's name.
LABEL_HEADER = "conveyor-label"

#: Makes a node's label from its step's arguments: ``(args, kwargs) -> str``.
Labeller: TypeAlias = "Callable[[tuple[Any, ...], dict[str, Any]], str]"

#: What ``after`` takes: a node, a Job or a job id, or any iterable of them.
Parents: TypeAlias = "Node | Job | int | Iterable[Node | Job | int]"


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
        after: Parents = (),
        after_failure: AfterFailure | None = None,
        label: str | Labeller | None = None,
    ) -> Node:
        """Add a step that runs after ``after`` (nodes of this workflow, or stored jobs: one,
        or any iterable of them). ``label`` names its job on the workflow's graph
        (``"extract 2026-11"``) instead of the task's name; a function of the step's
        arguments makes it from them (``lambda args, kwargs: f"extract {args[0]}"``)."""
        check_step(step)
        if label is not None:
            step = labelled(step, label)
        mine: list[int] = []
        jobs: list[int] = []
        for parent in parents_of(after):
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

    def chain(self, *steps: Step, after: Parents = ()) -> list[Node]:
        """Steps one after the other (the first after ``after``); returns their nodes."""
        nodes: list[Node] = []
        previous: Parents = after
        for step in steps:
            nodes.append(self.add(step, after=previous))
            previous = [nodes[-1]]
        return nodes

    def group(self, *steps: Step, after: Parents = ()) -> list[Node]:
        """Steps side by side, each after ``after``; returns their nodes."""
        parents = parents_of(after)
        return [self.add(step, after=parents) for step in steps]

    def chord(self, header: Sequence[Step], callback: Step, *, after: Parents = ()) -> Node:
        """A group, then ``callback`` after all of it (its ``ctx.upstream`` holds their results)."""
        if isinstance(header, Step | Task) or not isinstance(header, Sequence):
            raise InvalidJobError(
                "a chord's header is a list of steps ([task.step(1), task.step(2)]), "
                f"got {describe(header)}"
            )
        check_step(callback, "a chord's callback")
        return self.add(callback, after=self.group(*header, after=after))

    def enqueue(self) -> WorkflowRun:
        """Store the whole graph at once (see ``App.enqueue_workflow``)."""
        if not self.nodes:
            raise InvalidJobError(f"workflow {self.id!r} has no steps")
        app = self.nodes[0].step.task.app
        enqueue: Callable[[Workflow], WorkflowRun] = app.enqueue_workflow  # type: ignore[attr-defined]
        return enqueue(self)


def check_step(step: object, what: str = "a workflow") -> Step:
    """A Step, or an InvalidJobError that says how to make one."""
    if isinstance(step, Step):
        return step
    if isinstance(step, Task):
        raise InvalidJobError(
            f"{what} takes steps, got the task {step.name!r} itself: "
            f"write {step.name}.step(*args) to give it its arguments"
        )
    raise InvalidJobError(f"{what} takes steps (task.step(*args)), got {describe(step)}")


def describe(value: object) -> str:
    """A value as an error names it: its type, and itself when short."""
    shown = repr(value)
    return f"{type(value).__name__} {shown}" if len(shown) <= 60 else type(value).__name__


def parents_of(after: object) -> list[Node | Job | int]:
    """``after`` as a list: one node, Job or id, or an iterable of them (text is refused,
    rather than read as its characters)."""
    if isinstance(after, Node | Job | int):
        return [after]
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise InvalidJobError(
            f"after takes a node, a Job or a job id, or a list of them, got {describe(after)}"
        )
    return list(after)


def labelled(step: Step, label: object) -> Step:
    """The step with its label among its job's headers (where the graph reads it)."""
    if callable(label):
        label = label(step.args, dict(step.kwargs))
    validate_name("a node's label", label)
    assert isinstance(label, str)
    headers = {**(step.options.headers or {}), LABEL_HEADER: label}
    return dataclasses.replace(step, options=dataclasses.replace(step.options, headers=headers))


def label_of_job(job: Job) -> str | None:
    """The label a workflow gave the job's node (None: none)."""
    try:
        return job.headers.get(LABEL_HEADER)
    except ValueError:
        return None


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

    def retry_workflow(self, workflow_id: str) -> int: ...


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

    def retry(self) -> int:
        """Run it again from its failures (``App.retry_workflow``); returns how many jobs
        were put back."""
        return self._app.retry_workflow(self.id)


def check_workflow(wf: object) -> Workflow:
    if not isinstance(wf, Workflow):
        raise ConfigurationError(f"enqueue_workflow takes a Workflow, got {type(wf).__name__}")
    if not wf.nodes:
        raise InvalidJobError(f"workflow {wf.id!r} has no steps")
    return wf


def workflow_new_jobs(
    store: JobStore, workflow: Workflow, owner: object
) -> tuple[list[NewJob], datetime]:
    """The checked records of a workflow's jobs, each with the edges its node declares,
    and the moment they were made. Every step must be a task of ``owner`` (the App
    enqueueing them)."""
    new_jobs: list[NewJob] = []
    now = utcnow()
    for node in workflow.nodes:
        task = node.step.task
        if task.app is not owner:
            raise ConfigurationError(
                f"step {node.step!r} is a task of another App; a workflow is enqueued "
                "through the App of its tasks"
            )
        call = (node.step.args, node.step.kwargs)
        (new,), now = new_jobs_of(store, task, task.name, [call], node.step.options)
        new.after = tuple(dict.fromkeys((*new.after, *node.after_jobs)))
        new.after_new = node.after
        new.after_failure = node.after_failure
        new_jobs.append(new)
    return new_jobs, now
