"""Idempotency keys of an enqueue: which new jobs to insert, and which existing job
each of the others returns instead. The same plan on every backend; only the
lookup and the insert are SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from conveyor.errors import ConveyorError
from conveyor.job import LIVE_STATES, Job, JobState, NewJob

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
    if job.unique_states is not None:  # a window (unique.py): the newest job that fits
        since = job.unique_since
        return next(
            (
                c
                for c in candidates
                if c.state in job.unique_states and (since is None or c.created_at >= since)
            ),
            None,
        )
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
        raise ConveyorError(f"internal error: insert left positions {missing} without a job")
    return [job for job in results if job is not None]


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
        limit_key=new.limit_key,
        headers_json=new.headers_text(),
    )
