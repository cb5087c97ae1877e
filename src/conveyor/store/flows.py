"""Jobs that wait for other jobs: the rules every store follows, without I/O.

A job enqueued with ``after=`` parents is stored waiting while any parent has
not ended; each edge (child, parent) is resolved once, when the parent ends,
and counts the child's pending parents down. The finish of the last parent
queues the child (or, when a parent failed or was cancelled, cancels it unless
it runs anyway, ``after_failure="run"``), in the finish's own transaction.
A cancelled child's own children are resolved in turn.

The SQL stores run these plans as a few set-based statements per level of the
graph (never one per edge); the Redis store follows the same rules in Lua
(``flows.lua``). See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from conveyor.errors import InvalidJobError
from conveyor.job import Job, JobState, NewJob, lost_parent_error

#: Parent states in which an edge resolves without the child running
#: (unless it runs anyway).
#: An edge resolved by its parent's deletion (an operator's delete before it ended).
DELETED = "deleted"
#: An edge resolved by the drop of its parent, whose data was deleted or evicted
#: behind conveyor's back (Redis: upkeep.lua's drop, flows.lua's flow_dropped).
DROPPED = "dropped"
#: The resolutions of an edge whose parent is gone (the edge stays while its child does).
GONE = frozenset({DELETED, DROPPED})
PARENT_LOST = frozenset({JobState.FAILED.value, JobState.CANCELLED.value, *GONE})
ENDED = frozenset({JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value})


@dataclass(frozen=True, slots=True)
class Link:
    """One new job and the jobs it waits for (ids), as the insert resolved them."""

    child: int
    parents: tuple[int, ...]
    on_failure: str
    workflow: str | None = None


@dataclass
class LinkPlan:
    """What an insert writes for its waiting jobs."""

    #: (child, parent, resolved): resolved is the parent's end state, or None.
    edges: list[tuple[int, int, str | None]] = field(default_factory=list)
    #: (job, pending, on_failure, workflow)
    flows: list[tuple[int, int, str, str | None]] = field(default_factory=list)
    #: New jobs that wait.
    waiting: list[int] = field(default_factory=list)
    #: New jobs cancelled at once (a parent had already failed): (id, error).
    cancelled: list[tuple[int, str]] = field(default_factory=list)


def links_of(
    jobs: Sequence[NewJob], ids: Sequence[int], inserted: Iterable[int], workflow: str | None = None
) -> list[Link]:
    """The links of the jobs an insert wrote (positions ``inserted``; ``ids`` by position).

    A job the insert did not write (its key answered with an existing job) gets
    no edges: the existing job keeps its own. Within a workflow every node gets
    a row, so that the workflow knows its jobs.
    """
    check_order(jobs)
    links = []
    for position in inserted:
        new = jobs[position]
        if not new.waits and workflow is None:
            continue
        parents = tuple(dict.fromkeys((*new.after, *(ids[p] for p in new.after_new))))
        links.append(Link(ids[position], parents, new.after_failure, workflow))
    return links


def check_order(jobs: Sequence[NewJob]) -> None:
    """Refuse a job of an insert that waits for itself or a later job of it (no cycles)."""
    for position, new in enumerate(jobs):
        for earlier in new.after_new:
            if not 0 <= earlier < position:
                raise InvalidJobError(
                    f"job {position} of the insert waits for job {earlier} of it; a job "
                    "can only wait for jobs before it (that is what keeps cycles out)"
                )


def outside_parents(links: Sequence[Link], new_ids: set[int]) -> list[int]:
    """The parents that were not written by this insert: their states are read."""
    return sorted({p for link in links for p in link.parents if p not in new_ids})


def plan_links(
    links: Sequence[Link], states: Mapping[int, str], new_ids: Iterable[int] = ()
) -> LinkPlan:
    """Edges, pending counts and first states of new jobs, in insert order.

    ``states``: the state of every parent that this insert did not write (a
    missing one is refused). A parent written by this insert is queued, or, if
    it waits itself, waiting (or cancelled, if one of its parents was lost).
    ``new_ids``: every job this insert wrote.
    """
    missing = sorted({p for link in links for p in link.parents} - set(states))
    new_state = {i: JobState.QUEUED.value for i in new_ids}
    new_state.update((link.child, JobState.QUEUED.value) for link in links)
    missing = [p for p in missing if p not in new_state]
    if missing:
        raise unknown_parent(missing)
    plan = LinkPlan()
    for link in links:
        pending, lost = 0, None
        for parent in link.parents:
            state = states.get(parent) or new_state[parent]
            ended = state in ENDED
            plan.edges.append((link.child, parent, state if ended else None))
            if not ended:
                pending += 1
            elif state in PARENT_LOST and lost is None:
                lost = (parent, state)
        plan.flows.append((link.child, pending, link.on_failure, link.workflow))
        if lost is not None and link.on_failure != "run":
            plan.cancelled.append((link.child, lost_parent_error(*lost)))
            new_state[link.child] = JobState.CANCELLED.value
        elif pending:
            plan.waiting.append(link.child)
            new_state[link.child] = JobState.WAITING.value
    return plan


def unknown_parent(parents: Sequence[int]) -> InvalidJobError:
    """The refusal of an ``after`` that names jobs not stored before the new job."""
    shown = ", ".join(str(p) for p in parents[:10])
    return InvalidJobError(
        f"after names job {shown}, which does not exist (never created, purged, or "
        "enqueued after the job that would wait for it); a job can wait only for jobs "
        "stored before it"
    )


def check_edges_written(
    edges: Sequence[tuple[int, int, str | None]], written: Iterable[Sequence[object]]
) -> None:
    """Refuse an insert whose edge statement left edges out: it writes an edge only
    onto a job that exists and is older than the child (ids are handed out in
    order), so no job can wait for itself or for a job enqueued after it, and no
    cycle can form. ``written``: the (child, parent) rows the statement returned."""
    if len(edges) == len(written := list(written)):
        return
    done = {(int(str(c)), int(str(p))) for c, p in written}
    refused = [parent for child, parent, _ in edges if (child, parent) not in done]
    raise unknown_parent(sorted(set(refused)))


def ids_by_position(
    count: int, inserted: dict[int, int], existing: Mapping[int, int], same_as: Mapping[int, int]
) -> list[int]:
    """The id each position of an insert ended with: its new id, or the existing job's."""
    ids = [0] * count
    for position in range(count):
        if position in inserted:
            ids[position] = inserted[position]
        elif position in existing:
            ids[position] = existing[position]
        else:
            ids[position] = ids[same_as[position]]
    return ids


def first_states(plan: LinkPlan, jobs: Iterable[Job]) -> None:
    """Set the state of the Jobs an insert returns to the first state the plan gave them."""
    waiting = set(plan.waiting)
    cancelled = dict(plan.cancelled)
    for job in jobs:
        if job.id in waiting:
            job.state = JobState.WAITING
        elif job.id in cancelled:
            job.state, job.error = JobState.CANCELLED, cancelled[job.id]


@dataclass
class ReleasePlan:
    """What the resolution of some edges does: counts down, and jobs cancelled."""

    #: child -> edges resolved now
    count_down: dict[int, int] = field(default_factory=dict)
    #: child -> error, for children of a lost parent that do not run anyway
    lost: dict[int, str] = field(default_factory=dict)


def plan_release(resolved: Iterable[Sequence[object]]) -> ReleasePlan:
    """From rows (child, parent, parent's end state) of edges resolved now."""
    plan = ReleasePlan()
    for child, parent, state in sorted(resolved, key=lambda r: (int(str(r[0])), int(str(r[1])))):
        child_id, parent_id = int(str(child)), int(str(parent))
        plan.count_down[child_id] = plan.count_down.get(child_id, 0) + 1
        if state in PARENT_LOST and child_id not in plan.lost:
            plan.lost[child_id] = lost_parent_error(parent_id, str(state))
    return plan


def after_counted(
    plan: ReleasePlan, counted: Iterable[Sequence[object]]
) -> tuple[list[int], list[tuple[int, str]]]:
    """Given rows (job, pending, on_failure) after the count-down: jobs to queue, to cancel."""
    ready, cancel = [], []
    for job, pending, on_failure in counted:
        job_id = int(str(job))
        if job_id in plan.lost and on_failure != "run":
            cancel.append((job_id, plan.lost[job_id]))
        elif int(str(pending)) <= 0:
            ready.append(job_id)
    return sorted(ready), sorted(cancel)
