"""Which statements serve a JobSelection: the part of listing and counting that is not SQL.

The backends share this, as they share ``job_list_queries``: a statement whose
filters are all ``(:x IS NULL OR x = :x)`` cannot walk an index on x, so the
column that narrows the search most has a statement of its own (ids, a group,
a queue and state, a batch), and the other filters only skip rows.

A search of the arguments' text has no index (it looks inside JSON): it reads
only the ARGS_SEARCH_SPAN newest jobs (by id), so a search that matches
nothing costs the same at a million jobs as at ten million.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from conveyor.job import WAITING_STATES, JobState, base_state
from conveyor.store.base import JobSelection
from conveyor.store.listing import NO_ID_BOUND

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


def select_queries(
    selection: JobSelection,
    before_id: int | None,
    limit: int,
    queue_names: Callable[[], Sequence[str]],
    newest_id: Callable[[], int],
) -> list[tuple[str, dict[str, Any]]]:
    """The job_select statements that serve a selection; merge their pages with newest_first."""
    params = {
        **selection_params(selection, args_floor(selection, newest_id)),
        "before_id": NO_ID_BOUND if before_id is None else before_id,
        "limit": limit,
    }
    if selection.ids is not None:
        return [("job_select_by_ids", params)]
    if selection.group is not None:
        return [("job_select_by_group", params)]
    if selection.queue is None and selection.state is None:
        return [("job_select_by_batch" if selection.batch is not None else "job_select", params)]
    # One walk of jobs_queue_state per (queue, stored state), as job_list does.
    queues = [selection.queue] if selection.queue is not None else list(queue_names())
    if selection.state is not None:
        states = [str(base_state(selection.state))]
    else:
        states = [str(s) for s in JobState]
    return [
        ("job_select_by_queue_state", {**params, "queue": q, "base_state": s})
        for q in queues
        for s in states
    ]


def count_query(
    selection: JobSelection, newest_id: Callable[[], int]
) -> tuple[str, dict[str, Any]]:
    """The job_count statement that serves a selection (its state is applied by keep_state)."""
    params = selection_params(selection, args_floor(selection, newest_id))
    if selection.ids is not None:
        return "job_count_by_ids", params
    if selection.group is not None:
        return "job_count_by_group", params
    if selection.queue is not None:
        return "job_count_by_queue", params
    if selection.batch is not None:
        return "job_count_by_batch", params
    return "job_count", params


def keep_state(counts: dict[str, int], state: str | None) -> dict[str, int]:
    """Counts per detailed state, keeping only those a selection's ``state`` names."""
    if state is None:
        return counts
    if state == JobState.QUEUED:
        return {s: n for s, n in counts.items() if s in WAITING_STATES}
    return {s: n for s, n in counts.items() if s == state}
