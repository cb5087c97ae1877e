"""Reads of the Redis store's finished jobs that stay bounded as history grows.

Retention, trims, the dashboard's chart and the ``/metrics`` histogram read
finished jobs. Each reads pages of a bounded size: ``scripts/finished_page.lua``
walks one page of ``finished`` (terminal jobs by ``finished_at``) with
``ZRANGEBYSCORE ... LIMIT``, reads only the fields it needs of each job, and
answers with what the caller asked (counts per minute, run times per bucket,
the ids a retention rule deletes), not the jobs. A retention round examines at
most ``PURGE_WALK`` entries; a trim finds where its queue's newest ``keep``
jobs end by counting (``ZCOUNT``, logarithmic), not by reading every id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.store.redis.base import RedisBase

#: Entries of ``finished`` one script run reads: a few milliseconds of the server.
PAGE = 2_000
#: The most entries of ``finished`` one retention round examines, whatever it
#: finds: a rule that passes over many jobs it keeps (a state kept longer) goes
#: on from there in its next round.
PURGE_WALK = 20_000


@dataclass(frozen=True, slots=True)
class Page:
    """What ``finished_page.lua`` answered for one page."""

    read: int
    #: The score of the last entry read ('' when none), the entries of that
    #: score read, and of those the ones passed over (not chosen, not gone).
    last: str
    tied: int
    passed: int
    result: list[str]


def finished_pages(
    store: RedisBase,
    low: str,
    high: str,
    mode: Callable[[], Sequence[str]],
    skip: int = 0,
    page: int = PAGE,
) -> Iterator[Page]:
    """Pages of ``finished`` in [low, high] (score bounds), oldest first, the first
    ``skip`` entries (of score ``low``) left out; ``mode()`` gives the script's mode
    and its arguments for the next page. A job whose hash is gone is dropped, as
    every read of an index does."""
    start = low
    while True:
        read, last, tied, passed, gone, result = store._run(
            "finished_page", start, high, str(skip), str(page), *mode()
        )
        if gone:
            store._load([int(i) for i in gone], [(None, "finished")] * len(gone))
        yield Page(int(read), last, int(tied), int(passed), list(result))
        if int(read) < page:
            return
        # The next page starts at the last score read, past its entries already
        # read (a page that starts at the score it ends with is all of that score).
        skip, start = (skip + int(tied) if start == last else int(tied)), last


def slot_counts(
    store: RedisBase, low: str, since: float, width: float
) -> dict[tuple[str, str, int], int]:
    """Jobs finished from ``low`` on, per queue, state and slot (whole widths since ``since``)."""
    counts: dict[tuple[str, str, int], int] = {}
    mode = ("slots", repr(since), repr(width))
    for page in finished_pages(store, low, "+inf", lambda: mode):
        row = page.result
        for i in range(0, len(row), 4):
            key = (row[i], row[i + 1], int(row[i + 2]))
            counts[key] = counts.get(key, 0) + int(row[i + 3])
    return counts


def run_times(
    store: RedisBase, low: str, high: str, bounds: Sequence[float]
) -> dict[tuple[str, int], tuple[int, float]]:
    """Run times of the succeeded and failed jobs finished in [low, high], per queue and
    bucket: (jobs, seconds)."""
    buckets: dict[tuple[str, int], tuple[int, float]] = {}
    mode = ("runs", json.dumps([float(b) for b in bounds]))
    for page in finished_pages(store, low, high, lambda: mode):
        row = page.result
        for i in range(0, len(row), 4):
            key = (row[i], int(row[i + 1]))
            count, seconds = buckets.get(key, (0, 0.0))
            buckets[key] = (count + int(row[i + 2]), seconds + float(row[i + 3]))
    return buckets


class PurgeWalks:
    """Where each retention rule's walk of ``finished`` stopped, so that it goes on there.

    A round stops after ``PURGE_WALK`` entries or once it has ``limit`` jobs to
    delete; the next round of the same rule starts at the last entry it read,
    past those of that score it passed over (the ones it chose are deleted), and
    a walk that reached its cut-off starts again from the oldest entry the next
    time (what it passed over may have come due meanwhile, or finished at a
    moment earlier than the walk's place).
    """

    def __init__(self) -> None:
        self._resume: dict[tuple[tuple[str, ...], str | None], tuple[str, int]] = {}

    def candidates(
        self,
        store: RedisBase,
        cutoff: str,
        states: Sequence[str],
        queue: str | None,
        limit: int,
        by_policy: bool = False,
    ) -> list[int]:
        """Up to ``limit`` jobs of the rule finished before ``cutoff`` (a score bound);
        ``by_policy``: a queue's age rule, passing over the jobs with their own rule."""
        rule = (tuple(sorted(states)), queue)
        policy = "1" if by_policy else ""
        low, skip = self._resume.pop(rule, ("-inf", 0))
        budget = max(PURGE_WALK, limit)
        chosen: list[int] = []
        examined = 0
        wanted = json.dumps(list(states))

        def mode() -> Sequence[str]:  # each page stops once the limit is reached
            return ("purge", wanted, queue or "", str(limit - len(chosen)), policy)

        last, passed = low, skip
        for found in finished_pages(store, low, cutoff, mode, skip, min(PAGE, budget)):
            examined += found.read
            chosen += [int(i) for i in found.result]
            if found.read:
                passed = found.passed + (passed if found.last == last else 0)
                last = found.last
            if len(chosen) >= limit or examined >= budget:
                self._resume[rule] = (last, passed)
                return chosen
        return chosen


def count_matching(store: RedisBase, cutoff: str, states: Sequence[str], queue: str | None) -> int:
    """How many jobs of ``states`` (of ``queue``) finished before ``cutoff``: every page."""
    mode = ("purge", json.dumps(list(states)), queue or "", str(PAGE + 1))
    return sum(len(page.result) for page in finished_pages(store, "-inf", cutoff, lambda: mode))


def beyond_newest(client: Any, keys: Sequence[str], keep: int, limit: int) -> list[int]:
    """The ids after the ``keep`` newest of some sorted sets of ids (score = id), newest
    first, at most ``limit``.

    The id that ends the newest ``keep + 1`` is found by halving the range of ids,
    counting each half with ``ZCOUNT`` (logarithmic in a set's size), so a trim
    reads a few dozen counts and the ids it deletes, never the ids it keeps.
    """
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zrange(key, 0, 0, withscores=True)
        pipe.zrevrange(key, 0, 0, withscores=True)
    ends = [int(row[0][1]) for row in pipe.execute() if row]
    if not ends or limit <= 0:
        return []

    def newer_than(bound: int) -> int:
        """How many ids are at least ``bound``."""
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.zcount(key, bound, "+inf")
        return sum(int(n) for n in pipe.execute())

    low, high = min(ends), max(ends)
    if newer_than(low) <= keep:
        return []
    # The largest bound with more than ``keep`` ids at or above it: the newest id
    # beyond the ``keep`` newest.
    while low < high:
        middle = (low + high + 1) // 2
        if newer_than(middle) > keep:
            low = middle
        else:
            high = middle - 1
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.zrevrangebyscore(key, low, "-inf", 0, limit)
    found = (int(i) for ids in pipe.execute() for i in ids)
    return sorted(found, reverse=True)[:limit]
