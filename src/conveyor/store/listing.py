"""Listing jobs page by page: which statements serve a filter, and merging their pages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from conveyor.job import Job, JobState
from conveyor.store.base import JobFilter

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
