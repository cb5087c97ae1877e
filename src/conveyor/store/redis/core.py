"""JobStore on Redis: a job's life (insert, claim, heartbeat, finish, rescue),
periodic ticks, workers, the leader lease and change notifications.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from conveyor.errors import ConfigurationError
from conveyor.job import Job, NewJob
from conveyor.store.claims import ClaimAsk, ClaimEntry
from conveyor.store.finish_fetch import FetchNext
from conveyor.store.limiting import LIMIT_SLACK_SECONDS
from conveyor.store.protocols import ChangeCallback, Subscription
from conveyor.store.records import LEASE_EXPIRED_ERROR, Finish, Lease, LeaseStatus
from conveyor.store.redis.base import RedisBase, _dt, _new_job_json, _now_arg, _pairs, _ts, job_of
from conveyor.store.redis.listener import RedisListener

#: The sweep of dropped jobs' ids (job_sweep_lost.lua), run after each rescue while one
#: is due: keys a slice (a script of about 2 ms at 2,000), seconds of slices a rescue.
_SWEEP_KEYS = 2_000
_SWEEP_SECONDS = 0.05
#: How long a claim's answer to next_run_in stands in for asking (the worker asks
#: right after a claim that took fewer than it could; later, ask Redis).
_NEXT_DUE_FRESH = 0.5


class CoreMixin(ClaimEntry, RedisBase):
    """The core every capability builds on (``JobStore``)."""

    def job_insert_many(
        self, jobs: Sequence[NewJob], now: datetime, connection: Any = None
    ) -> list[Job]:
        if connection is not None:
            raise ConfigurationError(
                "enqueue inside a caller's transaction needs SQLite or PostgreSQL; "
                "Redis has no transaction to join"
            )
        if not jobs:
            return []
        return self._insert(jobs, now)

    def job_get(self, job_id: int) -> Job | None:
        return self._load([job_id])[0]

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        return [job for job in self._load(list(job_ids)) if job is not None]

    def next_run_in(
        self, queues: Sequence[str], now: datetime | None = None, group: str | None = None
    ) -> float | None:
        names = tuple(dict.fromkeys(queues))
        answered = self._next_due.pop(names, None) if now is None and group is None else None
        if answered is not None and time.monotonic() - answered[1] < _NEXT_DUE_FRESH:
            answer = answered[0]  # the claim just made on these queues answered it
        else:
            answer, unreadable = self._run(
                "next_run_in", json.dumps(list(names)), _now_arg(now), group or ""
            )
            self._drop(unreadable)
        if len(answer) < 2:
            return None
        return max(0.0, float(answer[1]) - float(answer[0]))

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        names, now, group = ask.queues, ask.now, ask.group
        flats, unreadable, due = self._run(
            "job_claim",
            json.dumps(list(names)),
            str(ask.limit),
            ask.worker,
            secrets.token_hex(16),
            f"{ask.lease.total_seconds():.6f}",
            _now_arg(now),
            group or "",
            str(LIMIT_SLACK_SECONDS),
        )
        self._drop(unreadable)
        if due and now is None and group is None:
            self._next_due[names] = (due, time.monotonic())
        return [job_of(_pairs(f)) for f in flats]

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime | None = None
    ) -> list[LeaseStatus]:
        if not leases:
            return []
        rows = self._run(
            "job_heartbeat",
            json.dumps([[str(le.id), le.token] for le in leases]),
            f"{lease.total_seconds():.6f}",
            _now_arg(now),
        )
        return [LeaseStatus(id=int(r[0]), cancel_requested=bool(int(r[1]))) for r in rows]

    def job_finish(self, finishes: Sequence[Finish], now: datetime | None = None) -> list[int]:
        if not finishes:
            return []
        return self._finish(finishes, _now_arg(now))[0]

    def job_finish_fetch(
        self, finishes: Sequence[Finish], fetch: FetchNext
    ) -> tuple[list[int], list[Job]]:
        if fetch.limit <= 0 or not fetch.queues:
            return self.job_finish(finishes), []
        return self._finish(
            finishes,
            "",
            json.dumps(list(dict.fromkeys(fetch.queues))),
            str(fetch.limit),
            fetch.worker,
            secrets.token_hex(16),
            f"{fetch.lease.total_seconds():.6f}",
            str(LIMIT_SLACK_SECONDS),
        )

    def _finish(
        self, finishes: Sequence[Finish], now: str, *fetch: str
    ) -> tuple[list[int], list[Job]]:
        """job_finish.lua: the ids changed, and the jobs it claimed when ``fetch`` asks."""
        items = [
            [
                str(f.id),
                f.token,
                f.kind,
                f.result_json,
                f.error,
                None if f.run_at is None else _ts(f.run_at),
            ]
            for f in finishes
        ]
        changed, unreadable, fetched = self._run("job_finish", now, json.dumps(items), *fetch)
        self._drop(unreadable)
        return [int(i) for i in changed], [job_of(_pairs(f)) for f in fetched]

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        return bool(
            self._run(
                "job_progress",
                str(lease.id),
                lease.token,
                "" if fraction is None else repr(float(fraction)),
                message or "",
                "0" if message is None else "1",
            )
        )

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        ids = self._run("job_rescue_expired", _now_arg(now), str(limit), LEASE_EXPIRED_ERROR)
        self._sweep_lost()
        return [int(i) for i in ids]

    def _sweep_lost(self) -> None:
        """Walk on with the sweep of dropped jobs' ids (job_sweep_lost.lua), if one is due:
        slices of ``_SWEEP_KEYS`` keys, each a short script, for ``_SWEEP_SECONDS`` at most."""
        deadline = time.monotonic() + _SWEEP_SECONDS
        while self._run("job_sweep_lost", str(_SWEEP_KEYS)) and time.monotonic() < deadline:
            pass

    def periodic_enqueue(self, name: str, tick: datetime, job: NewJob, now: datetime) -> bool:
        taken = self._run(
            "periodic_enqueue", name, _ts(tick), _ts(now), json.dumps(_new_job_json(job))
        )
        return bool(taken)

    def periodic_last_ticks(self) -> dict[str, datetime]:
        rows = self._do(lambda: self._client.hgetall(self._k("periodic")))
        return {name: _dt(tick) for name, tick in rows.items()}

    def queue_paused(self) -> set[str]:
        return set(self._do(lambda: self._client.smembers(self._k("paused"))))

    def subscribe(self, on_change: ChangeCallback) -> Subscription:
        return RedisListener(self._client, self.prefix, on_change)

    def worker_register(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: list[str],
        concurrency: int,
        now: datetime,
    ) -> None:
        info = json.dumps({"host": host, "pid": pid, "queues": queues, "concurrency": concurrency})
        self._run("worker_register", worker_id, info, _ts(now))

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> str | None:
        control = self._run("worker_beat", worker_id, str(jobs_in_hand), _ts(now))
        return control or None

    def worker_unregister(self, worker_id: str) -> None:
        self._run("worker_unregister", worker_id)

    def worker_prune(self, last_seen_before: datetime) -> int:
        return int(self._run("worker_prune", _ts(last_seen_before)))

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        return bool(self._run("leader_acquire", name, holder, _ts(now + ttl), _ts(now)))

    def leader_release(self, name: str, holder: str) -> None:
        self._run("leader_release", name, holder)
