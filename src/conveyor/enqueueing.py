"""Enqueue's rules before anything is written: a call of a task and its options made
into checked NewJob records (names, attempts, priority, due time, headers, parents).

Nothing here writes: the App inserts the records (through the middleware) in one
transaction, and a refused call leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from conveyor.errors import InvalidJobError
from conveyor.expiry import resolve_expires
from conveyor.job import (
    MAX_JOB_ID,
    Job,
    NewJob,
    check_headers,
    encode_payload,
    is_job_id,
    resolve_run_at,
    utcnow,
    validate_max_attempts,
    validate_name,
    validate_priority,
)
from conveyor.replace import check_on_conflict, debounced_run_at
from conveyor.retain import resolve_retain
from conveyor.store.capabilities import require
from conveyor.store.protocols import JobStore, WorkflowStore
from conveyor.task import BY_LIMIT_KEY, EnqueueOptions, Task
from conveyor.unique import resolve_unique

#: The queue of a task (or an enqueue by name) that names none.
DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3


def new_jobs_of(
    store: JobStore,
    registered: Task[Any, Any] | None,
    task: str,
    calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
    opts: EnqueueOptions,
) -> tuple[list[NewJob], datetime]:
    """The checked records of calls of one task with ``opts``, and the moment they were made."""
    validate_name("task name", task)
    default_queue = registered.queue if registered else DEFAULT_QUEUE
    queue = opts.queue if opts.queue is not None else default_queue
    validate_name("queue", queue)
    validate_name("key", opts.key, optional=True)
    validate_name("group", opts.group, optional=True)
    validate_name("batch", opts.batch, optional=True)
    validate_name("limit_key", opts.limit_key, optional=True)
    fair_key = stored_fair_key(
        opts.fair_key
        if opts.fair_key is not BY_LIMIT_KEY
        else getattr(registered, "fair_key", BY_LIMIT_KEY),
        opts.limit_key,
    )
    max_attempts = validate_max_attempts(
        opts.max_attempts
        if opts.max_attempts is not None
        else (registered.max_attempts if registered else DEFAULT_MAX_ATTEMPTS)
    )
    priority = validate_priority(
        opts.priority if opts.priority is not None else (registered.priority if registered else 0)
    )
    now = utcnow()
    on_conflict = check_on_conflict(opts.on_conflict, opts.key)
    if opts.debounce is not None:
        on_conflict = "replace"
        run_at = debounced_run_at(now, opts.debounce, opts.key, opts.delay, opts.run_at)
    else:
        run_at = resolve_run_at(now, opts.delay, opts.run_at)
    headers = check_headers(opts.headers)
    expires = opts.expires if opts.expires is not None else getattr(registered, "expires", None)
    expires_at = resolve_expires(now, run_at, expires)
    unique, unique_states, unique_since = resolve_unique(now, opts.unique)
    retain = resolve_retain(
        opts.retain if opts.retain is not None else getattr(registered, "retain", None)
    )
    after = parent_ids(opts.after)
    if opts.after_failure not in ("cancel", "run"):
        raise InvalidJobError(
            f"after_failure must be 'cancel' or 'run', got {opts.after_failure!r}"
        )
    if after:
        require(store, WorkflowStore, "make jobs wait for other jobs")
        if on_conflict == "replace":
            raise InvalidJobError(
                "on_conflict='replace' and debounce cannot wait for jobs (after=)"
            )
    new_jobs = []
    typed = registered.arguments if registered is not None else None
    for args, kwargs in calls:
        if typed is not None:  # validated, and made JSON, by the handler's annotations
            args, kwargs = typed.dump(args, kwargs)
        args_json, kwargs_json = encode_payload(args, kwargs)
        new_jobs.append(
            NewJob(
                queue=queue,
                task=task,
                args_json=args_json,
                kwargs_json=kwargs_json,
                run_at=run_at,
                priority=priority,
                max_attempts=max_attempts,
                key=opts.key,
                unique=unique,  # type: ignore[arg-type]  # "live" or "forever"
                unique_states=unique_states,
                unique_since=unique_since,
                on_conflict=on_conflict,
                group=opts.group,
                batch=opts.batch,
                limit_key=opts.limit_key,
                fair_key=fair_key,
                headers=dict(headers) if headers else None,
                after=after,
                after_failure=opts.after_failure,
                expires_at=expires_at,
                retain=retain,
            )
        )
    if opts.key is not None and len(new_jobs) > 1:
        # One key for many calls would silently collapse them into one job.
        raise InvalidJobError("key applies to one job; give each call its own key")
    return new_jobs, now


def stored_fair_key(fair_key: str | None, limit_key: str | None) -> str | None:
    """The fair key a job stores (NewJob.fair_key): None when it is its limit_key (a
    job that takes turns by its limit_key writes nothing more), "" for the shared key."""
    if fair_key is BY_LIMIT_KEY or fair_key == limit_key:
        return None
    if fair_key is None:
        return ""
    return validate_name("fair_key", fair_key)


def parent_ids(after: object) -> tuple[int, ...]:
    """The ids an ``after=`` option names (Jobs or ids), checked, in order, once each."""
    if after is None:
        return ()
    if isinstance(after, Job | int) and not isinstance(after, bool):
        after = [after]
    if not isinstance(after, list | tuple | set | frozenset):
        raise InvalidJobError(
            f"after must be a list of Jobs or job ids, got {type(after).__name__}"
        )
    ids: list[int] = []
    for parent in after:
        if isinstance(parent, Job):
            ids.append(parent.id)
        elif is_job_id(parent):
            ids.append(parent)
        else:
            raise InvalidJobError(
                f"after must name Jobs or job ids (integers from 1 to {MAX_JOB_ID}), got {parent!r}"
            )
    return tuple(dict.fromkeys(ids))
