"""Logic the backends share that is not SQL: idempotency-key planning, event kinds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from conveyor.job import LIVE_STATES, EventKind, Job, JobState, NewJob
from conveyor.store.base import JobFilter

KeyPair = tuple[str, str]


def key_pairs(jobs: Sequence[NewJob]) -> list[KeyPair]:
    """The distinct (queue, key) pairs a batch of new jobs names."""
    return list(dict.fromkeys((j.queue, j.key) for j in jobs if j.key is not None))


def match_existing(job: NewJob, candidates: Sequence[Job]) -> Job | None:
    """Which existing job, if any, an enqueue with a key should return instead of inserting.

    ``candidates`` are the jobs holding the same (queue, key), newest first.
    """
    live = next((c for c in candidates if c.state in LIVE_STATES), None)
    if live is not None:
        return live
    if job.unique == "forever" and candidates:
        return candidates[0]
    return None


@dataclass
class InsertPlan:
    """Which new jobs to insert, and where the others' answers come from."""

    #: Positions in the input to insert, in order.
    insert: list[int] = field(default_factory=list)
    #: Position -> existing job returned in its place.
    existing: dict[int, Job] = field(default_factory=dict)
    #: Position -> earlier position of the same batch holding the same key.
    same_as: dict[int, int] = field(default_factory=dict)


def plan_insert(jobs: Sequence[NewJob], found: Iterable[Job]) -> InsertPlan:
    by_key: dict[KeyPair, list[Job]] = {}
    for old in found:
        if old.key is not None:
            by_key.setdefault((old.queue, old.key), []).append(old)
    plan = InsertPlan()
    first_of_key: dict[KeyPair, int] = {}
    for position, new in enumerate(jobs):
        if new.key is None:
            plan.insert.append(position)
            continue
        pair = (new.queue, new.key)
        if pair in first_of_key:
            plan.same_as[position] = first_of_key[pair]
            continue
        first_of_key[pair] = position
        existing = match_existing(new, by_key.get(pair, []))
        if existing is None:
            plan.insert.append(position)
        else:
            plan.existing[position] = existing
    return plan


def resolve_plan(plan: InsertPlan, count: int, inserted: dict[int, Job]) -> list[Job]:
    """One Job per input position, from the inserted rows and the plan's existing ones."""
    results: list[Job | None] = [None] * count
    for position, job in inserted.items():
        results[position] = job
    for position, job in plan.existing.items():
        results[position] = job
    for position, earlier in plan.same_as.items():
        results[position] = results[earlier]
    missing = [i for i, job in enumerate(results) if job is None]
    if missing:
        raise RuntimeError(f"insert left positions {missing} without a job")
    return [job for job in results if job is not None]


# The event each action other than finishing records, by the state the job is
# in afterwards (finishing has its own rule: event_insert_finished in each
# backend's queries).
EVENT_KINDS: dict[str, dict[str, str]] = {
    "claim": {JobState.RUNNING: EventKind.CLAIMED},
    "cancel": {
        JobState.CANCELLED: EventKind.CANCELLED,
        JobState.RUNNING: EventKind.CANCEL_REQUESTED,
    },
    "retry": {JobState.QUEUED: EventKind.MANUAL_RETRY},
    "run_now": {JobState.QUEUED: EventKind.RUN_NOW},
}


def new_job_record(job_id: int, new: NewJob, now: datetime) -> Job:
    """The Job a fresh insert produced, built without reading it back."""
    return Job(
        id=job_id,
        queue=new.queue,
        task=new.task,
        state=JobState.QUEUED,
        args_json=new.args_json,
        kwargs_json=new.kwargs_json,
        priority=new.priority,
        run_at=new.run_at,
        attempts=0,
        max_attempts=new.max_attempts,
        created_at=now,
        key=new.key,
        group=new.group,
        batch=new.batch,
    )


#: A keyset page with no ``before_id`` starts below this id (the largest 64-bit integer):
#: an always-present bound lets the planner walk an index range from it.
NO_ID_BOUND = 2**63 - 1


def job_list_queries(
    filter: JobFilter, queue_names: Callable[[], Sequence[str]]
) -> list[tuple[str, dict[str, Any]]]:
    """The job_list statements that serve a filter, with their parameters.

    A statement with ``(:x IS NULL OR x = :x)`` for every filter cannot use an
    index on x (its plan is made before the value is known), so the driving
    columns have their own statement, whose index walks the page newest first
    from ``before_id`` down; the other filters only skip rows. jobs_queue_state
    leads with the queue: a state across queues is one walk per queue (from
    ``queue_names``), a queue across states one per state; merge the pages
    with ``newest_first``.
    """
    params = {
        "state": None if filter.state is None else str(filter.state),
        "queue": filter.queue,
        "task": filter.task,
        "batch": filter.batch,
        "error": filter.error or None,
        "before_id": NO_ID_BOUND if filter.before_id is None else filter.before_id,
        "limit": filter.limit,
    }
    if filter.queue is None and filter.state is None:
        return [("job_list_by_batch" if filter.batch is not None else "job_list", params)]
    queues = [filter.queue] if filter.queue is not None else list(queue_names())
    states = [str(filter.state)] if filter.state is not None else [str(s) for s in JobState]
    return [
        ("job_list_by_queue_state", {**params, "queue": q, "state": s})
        for q in queues
        for s in states
    ]


def newest_first(pages: Sequence[Sequence[Job]], limit: int) -> list[Job]:
    """The newest ``limit`` jobs of pages that are each newest first."""
    if len(pages) == 1:
        return list(pages[0][:limit])
    # Pages never share a job (each is one queue and state), so no duplicates.
    return sorted((job for page in pages for job in page), key=lambda j: -j.id)[:limit]
