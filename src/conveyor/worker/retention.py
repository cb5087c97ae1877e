"""Retention: which finished jobs go (its policy), one round that deletes them, its leader.

``App(retention=..., retention_by_state=..., keep_finished=...)`` makes the
policy; every worker's maintenance and every consumer's rescuer runs for the
retention lease, and its holder applies a round now and then. A deletion is
safe to run twice, so a leader that changes mid-round does no harm.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from datetime import datetime, timedelta

from conveyor.bulk import FINAL_STATES, check_final_states
from conveyor.errors import ConfigurationError
from conveyor.job import utcnow, validate_name
from conveyor.store.protocols import InsightStore, JobStore, OperatorStore
from conveyor.store.records import Purge
from conveyor.store.retaining import RetainingStore, own_retention

log = logging.getLogger("conveyor.maintenance")

#: Retention has a leader of its own: every process that consumes (a worker's
#: maintenance, a consumer's rescuer) runs for it, and one of them acts.
RETENTION_LEADER = "retention"
#: Seconds between two rounds of retention by count (each counts a queue's finished jobs).
COUNT_RETENTION_EVERY = 60.0
#: Most finished jobs a count rule keeps per queue (within every store's integer).
MAX_KEEP = 1_000_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Keep:
    """How long, and how many, finished jobs of one final state are kept (``retention_by_state``).

    ``Keep(age=timedelta(days=7), count=1000)`` for failed jobs is BullMQ's
    ``removeOnFail: {age, count}``: a failed job goes once it is older than a
    week, or once a queue has 1,000 newer failed jobs, whichever comes first.
    Either may be None (no rule of that kind); ``count`` applies per queue.
    """

    age: timedelta | None = None
    count: int | None = None


class Retention:
    """An App's retention rules, checked, and the round that applies them.

    ``age`` applies to the final states ``by_state`` does not name;
    ``keep_finished`` trims each queue to its newest finished jobs, and a
    ``Keep``'s count each queue to its newest jobs of that state.
    """

    def __init__(
        self,
        age: timedelta | None = None,
        by_state: Mapping[str, timedelta | Keep] | None = None,
        keep_finished: int | Mapping[str, int] | None = None,
    ) -> None:
        self.age = age
        self.by_state, self.keep_by_state = check_retention_by_state(by_state)
        self.keep_finished = check_keep_finished(keep_finished)
        #: Seconds between two rounds of the count rules (``keep_finished``, a Keep's
        #: count): each counts finished jobs. ``app.trim`` applies one at once.
        self.count_every = COUNT_RETENTION_EVERY
        self._next_count = 0.0

    @property
    def enabled(self) -> bool:
        """Whether any rule is set (the housekeeping of workers and consumers)."""
        return bool(
            self.age is not None
            or self.by_state
            or self.keep_by_state
            or self.keep_finished is not None
        )

    def apply(self, store: OperatorStore, now: datetime, *, own: bool = False) -> int:
        """One round; returns the jobs deleted. Each rule deletes at most 10,000 jobs a
        round, so a big backlog goes over a few rounds; the count rules run at most
        every ``count_every`` seconds, as they count finished jobs to do so. The age
        rules pass over the jobs with a rule of their own for the state they ended in
        (``retain=``): the maintenance round applies those (``job_purge_retained``), and
        this round too with ``own`` (``app.apply_retention``)."""
        deleted = own_retention(store, now) if own else 0
        if self.age is not None:
            rest = [s for s in FINAL_STATES if s not in self.by_state]
            if rest:
                deleted += store.job_purge_where(Purge(now - self.age, rest, by_policy=True))
        for state, age in self.by_state.items():
            deleted += store.job_purge_where(Purge(now - age, [state], by_policy=True))
        counting = self.keep_finished is not None or self.keep_by_state
        if counting and time.monotonic() >= self._next_count:
            self._next_count = time.monotonic() + self.count_every
            names = store.queue_names() if isinstance(store, InsightStore) else []
            if isinstance(self.keep_finished, int):
                keeps = dict.fromkeys(names, self.keep_finished)
            else:
                keeps = dict(self.keep_finished or {})
            for queue, keep in keeps.items():
                deleted += store.job_purge_beyond(queue, keep, FINAL_STATES)
            for state, keep in self.keep_by_state.items():
                for queue in names:  # per queue, as removeOnFail's count is per queue
                    deleted += store.job_purge_beyond(queue, keep, [state])
        return deleted


class Housekeeping:
    """Retention, led: run by every worker's maintenance and every consumer's rescuer,
    so that a consume-only service prunes as a worker does; the holder of the
    retention lease acts, the others skip their turn."""

    def __init__(
        self,
        store: JobStore,
        retention: Retention,
        holder: str,
        ttl: timedelta,
        *,
        own: bool = False,
    ):
        self.store = store
        self.retention = retention
        self.holder = holder
        self.ttl = ttl
        self.is_leader = False
        #: Whether its rounds apply the jobs' own rules too (a consumer's: a worker's
        #: maintenance applies those itself, every round).
        self.own = own and isinstance(store, RetainingStore)

    def run(self, now: datetime | None = None) -> int:
        """One round of retention if this process leads it; the jobs deleted."""
        store = self.store
        if not isinstance(store, OperatorStore) or not (self.retention.enabled or self.own):
            return 0
        wall = now or utcnow()
        self.is_leader = store.leader_acquire(RETENTION_LEADER, self.holder, self.ttl, wall)
        return self.retention.apply(store, wall, own=self.own) if self.is_leader else 0

    def release(self) -> None:
        if self.is_leader:
            try:
                self.store.leader_release(RETENTION_LEADER, self.holder)
            except Exception:
                log.exception("could not release the retention lease")
            self.is_leader = False


def check_retention_by_state(
    by_state: Mapping[str, timedelta | Keep] | None,
) -> tuple[dict[str, timedelta], dict[str, int]]:
    """The age and count rules of ``retention_by_state``, each checked."""
    chosen = dict(by_state or {})
    check_final_states(list(chosen) or None)
    ages: dict[str, timedelta] = {}
    counts: dict[str, int] = {}
    for state, rule in chosen.items():
        age, count = (rule.age, rule.count) if isinstance(rule, Keep) else (rule, None)
        if age is not None:
            if not isinstance(age, timedelta) or age < timedelta(0):
                raise ConfigurationError(
                    f"retention_by_state[{state!r}] must be a timedelta of zero or more, "
                    "or a Keep(age=..., count=...)"
                )
            ages[state] = age
        if count is not None:
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ConfigurationError(
                    f"retention_by_state[{state!r}]: Keep's count must be a number of jobs "
                    f"(0 or more), got {count!r}"
                )
            counts[state] = count
    return ages, counts


def check_keep_finished(
    keep: int | Mapping[str, int] | None, what: str = "keep_finished"
) -> int | dict[str, int] | None:
    if keep is None:
        return None
    values = list(keep.values()) if isinstance(keep, Mapping) else [keep]
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_KEEP:
            raise ConfigurationError(
                f"{what} must be a whole number of jobs from 0 to {MAX_KEEP:,}, got {value!r}"
            )
    if not isinstance(keep, Mapping):
        return keep
    for queue in keep:
        validate_name("queue", queue)
    return dict(keep)
