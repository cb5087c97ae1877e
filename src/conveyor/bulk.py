"""Operating on many jobs at once: naming them (ids, filters) and acting on them in pages.

A bulk action names its jobs by ids, by filters (the fields of JobSelection),
or both. Over filters it walks the matching jobs newest first, a page of
BULK_BATCH at a time, and acts on each page in one transaction; each action
checks the state of every job as it changes it, so a job that moved on since
it was read (a retry that runs, a cancel that finished) is left as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from conveyor.errors import ConfigurationError, JobNotFoundError
from conveyor.job import (
    FILTER_STATES,
    TERMINAL_STATES,
    WAITING_STATES,
    Job,
    JobState,
    retry_refusal,
    utcnow,
    validate_name,
)
from conveyor.store.capabilities import operator_store
from conveyor.store.protocols import JobStore, OperatorStore
from conveyor.store.records import JobSelection, Page

#: Jobs acted on per transaction by a bulk action.
BULK_BATCH = 1000
FINAL_STATES = tuple(str(s) for s in JobState if s in TERMINAL_STATES)
#: The states each bulk action changes; it leaves jobs in other states alone.
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "retry": ("failed", "cancelled"),
    "cancel": ("waiting", "queued", "running"),
    "delete": ("waiting", "queued", "succeeded", "failed", "cancelled"),
    "run_now": ("scheduled", "retrying"),
    "take_back": ("running",),
    "hold": ("queued",),
    "unhold": ("scheduled",),
}
SELECTION_FILTERS = (
    "state", "queue", "task", "group", "batch", "error", "worker", "key", "limit_key", "args",
)  # fmt: skip
#: Longest text searched for in errors or arguments.
MAX_SEARCH_TEXT = 200
#: The oldest a purge reaches back: a thousand years (a cutoff before year 1 cannot be written).
MAX_AGE = timedelta(days=365_000)

#: What acts on one page of job ids (in one transaction), returning the ids it changed.
Act = Callable[[Sequence[int], datetime], list[int]]


def store_action(store: OperatorStore, action: str) -> Act:
    """The store's statement for a bulk action of BULK_ACTIONS (not hold/unhold: HoldStore's)."""
    acts: dict[str, Act] = {
        "retry": store.job_retry_many,
        "cancel": store.job_cancel_many,
        "delete": lambda ids, now: store.job_delete_many(ids),
        "run_now": store.job_run_now,
        "take_back": store.job_take_back,
    }
    return acts[action]


def walk(
    store: OperatorStore,
    selection: JobSelection,
    applies_to: tuple[str, ...],
    act: Act,
    on_batch: Callable[[int], None] | None,
    changed: Callable[[str], None],
) -> int:
    """Act on every job of ``selection`` in a state of ``applies_to``; how many changed.

    ``changed(queue)`` after each page that changed jobs (to wake this
    process's workers); ``on_batch(count)`` after each page (a progress bar).
    """
    if selection.empty:
        raise ConfigurationError(
            f"name the jobs: give ids, or at least one filter ({', '.join(SELECTION_FILTERS)})"
        )
    total = 0

    def done(ids: list[int]) -> None:
        nonlocal total
        total += len(ids)
        if ids:
            changed(selection.queue or "")
        if on_batch is not None:
            on_batch(len(ids))

    if selection.ids is not None and selection == JobSelection(ids=selection.ids):
        # The action itself checks each job's state: no need to read them first.
        for start in range(0, len(selection.ids), BULK_BATCH):
            done(act(selection.ids[start : start + BULK_BATCH], utcnow()))
        return total
    for state in states_to_walk(selection.state, applies_to):
        narrowed = dataclasses.replace(selection, state=state)
        before: int | None = None
        while True:
            page = store.job_select(narrowed, utcnow(), Page(BULK_BATCH, before))
            if not page:
                break
            done(act([job.id for job in page], utcnow()))
            before = page[-1].id
    return total


def job_selection(ids: Sequence[int] | None = None, **filters: str | None) -> JobSelection:
    """A JobSelection from ids and filters, checked: an unknown filter or state is refused."""
    unknown = set(filters) - set(SELECTION_FILTERS)
    if unknown:
        raise ConfigurationError(
            f"unknown filter {', '.join(sorted(unknown))}: use {', '.join(SELECTION_FILTERS)}"
        )
    state = filters.get("state")
    if state is not None and state not in FILTER_STATES:
        raise ConfigurationError(f"unknown state {state!r}: use one of {', '.join(FILTER_STATES)}")
    for name in ("queue", "task", "group", "batch", "worker", "key", "limit_key"):
        validate_name(name, filters.get(name), optional=True)
    for name in ("error", "args"):
        text = filters.get(name)
        if text is not None and (
            not isinstance(text, str) or len(text) > MAX_SEARCH_TEXT or "\x00" in text
        ):
            raise ConfigurationError(
                f"the {name} text to look for must be text under {MAX_SEARCH_TEXT} characters"
            )
    chosen: tuple[int, ...] | None = None
    if ids is not None:
        if isinstance(ids, int | str):
            raise ConfigurationError("ids must be a list of job ids")
        chosen = tuple(int(i) for i in ids)
        if any(not 0 < i < 2**63 for i in chosen):
            raise ConfigurationError("job ids are positive 64-bit integers")
    return JobSelection(
        ids=chosen, **{name: filters.get(name) or None for name in SELECTION_FILTERS}
    )


def states_to_walk(state: str | None, applies_to: tuple[str, ...]) -> list[str]:
    """The states a bulk action walks: those it applies to, within the selection's state."""
    if state is None:
        return list(applies_to)
    if state in applies_to:
        return [state]
    if state in WAITING_STATES and "queued" in applies_to:
        return [state]
    if state == "queued":
        return [s for s in applies_to if s in WAITING_STATES]
    return []


def check_age(older_than: timedelta | float) -> timedelta:
    """A purge's age (a timedelta, or seconds), from 0 to MAX_AGE; raise ConfigurationError."""
    seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 0 <= seconds <= MAX_AGE.total_seconds()
    ):
        raise ConfigurationError(
            f"older_than must be from 0 to {MAX_AGE.days:,} days (a thousand years), "
            f"got {older_than!r}"
        )
    return timedelta(seconds=seconds)


def check_final_states(states: Sequence[str] | None) -> list[str]:
    """Final states named for a purge (all three when None), each checked."""
    if states is None:
        return list(FINAL_STATES)
    if isinstance(states, str):
        states = [states]
    for state in states:
        if state not in FINAL_STATES:
            raise ConfigurationError(
                f"only finished jobs are purged: {state!r} is not one of {', '.join(FINAL_STATES)}"
            )
    if not states:
        raise ConfigurationError("name at least one final state to purge")
    return list(dict.fromkeys(states))


def retry_one(store: JobStore, job_id: int) -> Job:
    """Queue one failed or cancelled job again with its attempts reset: the job as it is now.

    Raises JobNotFoundError for an unknown job, and the reason a job cannot be
    retried (retry_refusal) for one that was not.
    """
    changed = operator_store(store, "retry jobs").job_retry_many([job_id], utcnow())
    job = store.job_get(job_id)
    if job is None:
        raise JobNotFoundError(f"no job with id {job_id}")
    if not changed:
        raise retry_refusal(job)
    return job
