"""The plan of an enqueue with ``on_conflict="replace"`` (conveyor/replace.py) on the
SQL stores: each keyed job with it first tries its store's ``job_replace`` (the
queued job of the key takes its arguments, run_at and priority, decided in that
statement), else ``job_key_release`` (a running job of the key gives the key up)
and joins the rest of the batch in the ordinary insert, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from conveyor.errors import InvalidJobError
from conveyor.job import Job, NewJob

#: Runs job_replace for one job: the job it replaced, or None when no queued job
#: holds the key (then job_key_release has run).
ReplaceOne = Callable[[NewJob], Job | None]
InsertRest = Callable[[list[NewJob]], list[Job]]


def insert_replacing(
    jobs: Sequence[NewJob], now: datetime, replace_one: ReplaceOne, insert: InsertRest
) -> list[Job]:
    """The Job of each input position: replaced in place, or inserted (or answered)."""
    answers: dict[int, Job] = {}
    rest: list[int] = []
    for position, new in enumerate(jobs):
        if new.on_conflict == "replace":
            if new.key is None or new.waits:
                raise InvalidJobError("on_conflict='replace' needs a key, and no after=")
            replaced = replace_one(new)
            if replaced is not None:
                answers[position] = replaced
                continue
        rest.append(position)
    inserted = insert([replace(jobs[p], on_conflict="answer") for p in rest]) if rest else []
    for position, job in zip(rest, inserted, strict=True):
        new = jobs[position]
        if new.on_conflict == "replace" and job.created_at != now and job.state == "queued":
            # Another producer's job took the key between this job's replace and its
            # insert (a unique violation answered with it): replace that one.
            job = replace_one(new) or job
        answers[position] = job
    return [answers[p] for p in range(len(jobs))]


def replace_params(new: NewJob) -> dict[str, object]:
    """What job_replace and job_key_release take, but for the clock."""
    return {
        "queue": new.queue,
        "key": new.key,
        "args": new.args_json,
        "kwargs": new.kwargs_json,
        "priority": new.priority,
    }
