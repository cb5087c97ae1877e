"""How a JobSelection is listed and counted: the part of it that is not SQL.

The SQL stores share this. A statement whose filters are all ``(:x IS NULL OR
x = :x)`` cannot walk an index on x (its plan may be made before the value is
known), so the column that narrows the search most drives it: job_select and
job_count take that condition from one of the ``drive_*`` blocks (ids, a group,
a queue and state, a queue, a batch, or none), and the other filters only skip
rows. jobs_queue_state leads with the queue: a state across queues is one walk
per queue, a queue across states one per state; ``newest_first`` merges pages.

A search of the arguments' text has no index (it looks inside JSON): it reads
only the ARGS_SEARCH_SPAN newest jobs (by id), so a search that matches
nothing costs the same at a million jobs as at ten million.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conveyor.job import WAITING_STATES, Job, JobState, base_state
from conveyor.store.records import JobSelection, Page

#: A keyset page with no ``before_id`` starts below this id (the largest 64-bit integer):
#: an always-present bound lets the planner walk an index range from it.
NO_ID_BOUND = 2**63 - 1

#: How many of the newest jobs (by id) a search of the arguments' text reads.
ARGS_SEARCH_SPAN = 100_000


def args_floor(selection: JobSelection, newest_id: Callable[[], int]) -> int:
    """The id above which the arguments are searched (0 when they are not)."""
    if selection.args is None:
        return 0
    return max(0, newest_id() - ARGS_SEARCH_SPAN)


def selection_params(selection: JobSelection, floor: int = 0) -> dict[str, Any]:
    """The filters as statement parameters (``ids`` as a list; each backend encodes it)."""
    return {
        "state": selection.state,
        "queue": selection.queue,
        "task": selection.task,
        "group": selection.group,
        "batch": selection.batch,
        "error": selection.error or None,
        "worker": selection.worker,
        "key": selection.key,
        "limit_key": selection.limit_key,
        "args": selection.args or None,
        "args_floor": floor,
        "ids": None if selection.ids is None else list(selection.ids),
    }


def driven(queries: Mapping[str, str], name: str, driver: str) -> str:
    """Statement ``name`` (job_select or job_count) with the ``drive_<driver>`` condition."""
    return queries[name].replace("{driver}", queries[f"drive_{driver}"])


def select_queries(
    selection: JobSelection,
    page: Page,
    queue_names: Callable[[], Sequence[str]],
    newest_id: Callable[[], int],
) -> list[tuple[str, dict[str, Any]]]:
    """The drivers of the job_select runs that serve a selection, with their parameters.

    Merge their pages with ``newest_first``.
    """
    params = {
        **selection_params(selection, args_floor(selection, newest_id)),
        "before_id": NO_ID_BOUND if page.before_id is None else page.before_id,
        "limit": page.limit,
    }
    if selection.ids is not None:
        return [("ids", params)]
    if selection.group is not None:
        return [("group", params)]
    if selection.queue is None and selection.state is None:
        return [("batch" if selection.batch is not None else "all", params)]
    # One walk of jobs_queue_state per (queue, stored state).
    queues = [selection.queue] if selection.queue is not None else list(queue_names())
    if selection.state is not None:
        states = [str(base_state(selection.state))]
    else:
        states = [str(s) for s in JobState]
    return [
        ("queue_state", {**params, "queue": q, "base_state": s}) for q in queues for s in states
    ]


def count_query(
    selection: JobSelection, newest_id: Callable[[], int]
) -> tuple[str, dict[str, Any]]:
    """The driver of the job_count that serves a selection (its state is applied by keep_state)."""
    params = selection_params(selection, args_floor(selection, newest_id))
    for driver in ("ids", "group", "queue", "batch"):
        if getattr(selection, driver) is not None:
            return driver, params
    return "all", params


def keep_state(counts: dict[str, int], state: str | None) -> dict[str, int]:
    """Counts per detailed state, keeping only those a selection's ``state`` names."""
    if state is None:
        return counts
    if state == JobState.QUEUED:
        return {s: n for s, n in counts.items() if s in WAITING_STATES}
    return {s: n for s, n in counts.items() if s == state}


def newest_first(pages: Sequence[Sequence[Job]], limit: int) -> list[Job]:
    """The newest ``limit`` jobs of pages that are each newest first."""
    if len(pages) == 1:
        return list(pages[0][:limit])
    # Pages never share a job (each is one queue and stored state), so no duplicates.
    return sorted((job for page in pages for job in page), key=lambda j: -j.id)[:limit]
