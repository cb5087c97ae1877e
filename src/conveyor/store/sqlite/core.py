"""JobStore on SQLite: a job's life (insert, claim, heartbeat, finish, rescue),
periodic ticks, workers, the leader lease and change notifications.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from conveyor.job import Job, NewJob, utcnow
from conveyor.store.claims import ClaimAsk, ClaimEntry
from conveyor.store.flows import first_states
from conveyor.store.keys import key_pairs, new_job_record, plan_insert, resolve_plan
from conveyor.store.limiting import LIMIT_SLACK_SECONDS
from conveyor.store.protocols import ChangeCallback, Subscription
from conveyor.store.records import LEASE_EXPIRED_ERROR, Finish, Lease, LeaseStatus
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import (
    _Q,
    SQLiteBase,
    _dt_required,
    _finish,
    _row_to_job,
    _ts,
)
from conveyor.store.sqlite.expiry import insert_with_deadlines
from conveyor.store.sqlite.fair_keys import write_fair_keys
from conveyor.store.sqlite.replace import insert_replacing_on
from conveyor.store.sqlite.retaining import write_retain
from conveyor.store.sqlite.watcher import DataVersionWatcher

#: A count no claim reaches (SQLite's 32-bit "no limit").
_NO_LIMIT = 2**31 - 1


class CoreMixin(ClaimEntry, SQLiteBase):
    """The core every capability builds on (``JobStore``)."""

    def job_insert_many(
        self,
        jobs: Sequence[NewJob],
        now: datetime,
        connection: Any = None,
        *,
        workflow: str | None = None,
    ) -> list[Job]:
        if not jobs:
            return []
        if any(new.on_conflict == "replace" for new in jobs):
            return insert_replacing_on(self, jobs, now, connection, workflow)
        now_ts = _ts(now)
        with self._write(connection) as conn:
            pairs = key_pairs(jobs)
            found = (
                [
                    _row_to_job(r)
                    for r in conn.execute(_Q["job_find_keys"], {"pairs": json.dumps(pairs)})
                ]
                if pairs
                else []
            )
            plan = plan_insert(jobs, found)
            count = len(plan.insert)
            last = conn.execute(_Q["job_take_ids"], {"count": count}).fetchone()[0]
            first = last - count + 1
            rows = []
            inserted: dict[int, Job] = {}
            for offset, position in enumerate(plan.insert):
                new = jobs[position]
                job_id = first + offset
                rows.append(
                    (
                        job_id,
                        new.queue,
                        new.task,
                        new.args_json,
                        new.kwargs_json,
                        new.priority,
                        _ts(new.run_at),
                        new.max_attempts,
                        new.key,
                        new.group,
                        new.batch,
                        now_ts,
                        new.limit_key,
                        new.headers_text(),
                    )
                )
                inserted[position] = new_job_record(job_id, new, now)
            if rows:
                if any(new.expires_at is not None for new in jobs):
                    insert_with_deadlines(conn, rows, [jobs[p] for p in plan.insert])
                else:
                    conn.executemany(_Q["job_insert"], rows)
                if any(new.retain is not None for new in jobs):
                    owned = zip(rows, plan.insert, strict=True)
                    write_retain(conn, [(r[0], jobs[p].retain) for r, p in owned])
                if any(new.fair_key is not None for new in jobs):
                    owned = zip(rows, plan.insert, strict=True)
                    write_fair_keys(conn, [(r[0], jobs[p].fair_key) for r, p in owned])
                conn.execute(
                    _Q["event_insert_enqueued"], {"first": first, "last": first + len(rows) - 1}
                )
            results = resolve_plan(plan, len(jobs), inserted)
            if workflow is not None or any(new.waits for new in jobs):
                ids = [job.id for job in results]
                linked = sqlite_flows.link(conn, jobs, ids, plan.insert, now_ts, workflow)
                first_states(linked, results)
        return results

    def job_get(self, job_id: int) -> Job | None:
        row = self._conn().execute(_Q["job_get"], {"id": job_id}).fetchone()
        return None if row is None else _row_to_job(row)

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        rows = self._conn().execute(_Q["job_get_many"], {"ids": json.dumps(list(job_ids))})
        by_id = {job.id: job for job in map(_row_to_job, rows)}
        return [by_id[i] for i in job_ids if i in by_id]

    def next_run_in(
        self, queues: Sequence[str], now: datetime | None = None, group: str | None = None
    ) -> float | None:
        now_ts = _ts(now or utcnow())
        params = {
            "queues": json.dumps(list(queues)),
            "now": now_ts,
            "group": group,
            "limit": _NO_LIMIT,  # as large as a claim's can be
        }
        value = self._conn().execute(_Q["next_run_at"], params).fetchone()[0]
        return None if value is None else max(0.0, value - now_ts)

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        with self._write() as conn:
            jobs = self._claim_in(conn, ask)
        # RETURNING order is unspecified: hand jobs out in claim order.
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs

    def _claim_in(self, conn: sqlite3.Connection, ask: ClaimAsk) -> list[Job]:
        """The claim of ``ask``, in the caller's write transaction (unordered)."""
        names = json.dumps(list(ask.queues))
        params = {**claim_params(ask), "queues": names}
        limited = conn.execute(_Q["limit_any"], {"queues": names}).fetchone() is not None
        if not limited:  # the plain claim, as if limits did not exist
            return [_row_to_job(r) for r in conn.execute(_Q["job_claim"], params)]
        jobs = [_row_to_job(r) for r in conn.execute(_Q["job_claim_limited"], params)]
        self._record_starts(conn, names, [j.id for j in jobs], params["now"])
        return jobs

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime | None = None
    ) -> list[LeaseStatus]:
        if not leases:
            return []
        items = json.dumps([[le.id, le.token] for le in leases])
        with self._write() as conn:
            # The new expiry counts from the moment this holds the write lock: a
            # renewal that waited for another transaction (a handler's ctx.complete
            # before its commit) must not give its leases only what was left of
            # the wait.
            expires = _ts((now or utcnow()) + lease)
            params = {"items": items, "lease_expires_at": expires}
            rows = conn.execute(_Q["job_heartbeat"], params).fetchall()
        return [LeaseStatus(id=r[0], cancel_requested=bool(r[1])) for r in rows]

    def job_finish(self, finishes: Sequence[Finish], now: datetime | None = None) -> list[int]:
        if not finishes:
            return []
        with self._write() as conn:
            return _finish(conn, finishes, _ts(now or utcnow()))

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        params = {"id": lease.id, "token": lease.token, "fraction": fraction, "message": message}
        with self._write() as conn:
            return conn.execute(_Q["job_progress"], params).rowcount == 1

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        waited, self._lock_waited = self._lock_waited, False
        if waited and not self._rescue_waited:
            # A write of this process (the maintenance round's before this one, a
            # renewal) waited for another transaction's write lock: a handler's
            # ctx.complete before its commit, a backup. The workers' renewals waited
            # for it too, and leases ran out meanwhile that no worker could renew.
            # This round is given up, so that those renewals, queued for the lock as
            # well, come first; the next round rescues what is still expired. Never
            # twice in a row: on a database always that busy, dead workers' jobs
            # still come back.
            self._rescue_waited = True
            return []
        self._rescue_waited = False
        params = {"now": _ts(now or utcnow()), "limit": limit}
        if not self._conn().execute(_Q["job_expired_leases"], params).fetchall():
            return []
        # Leases ran out. If a transaction held the write lock until just now, their
        # renewals are still asleep in SQLite's busy handler: this round would take
        # the lock before them. It waits for the lock to have been free a while
        # (base.RESCUE_QUIET) instead, and judges the leases again under it.
        with self._quiet_write() as conn:
            when = _ts(now or utcnow())  # judged under the lock, as renewals write
            params = {"now": when, "limit": limit}
            expired = conn.execute(_Q["job_expired_leases"], params).fetchall()
            rescues = [
                Finish(id_, token, "rescue", error=LEASE_EXPIRED_ERROR) for id_, token in expired
            ]
            return _finish(conn, rescues, when) if rescues else []

    def periodic_enqueue(self, name: str, tick: datetime, job: NewJob, now: datetime) -> bool:
        with self._write() as conn:
            params = {"name": name, "tick": _ts(tick), "now": _ts(now)}
            if conn.execute(_Q["periodic_tick_take"], params).fetchone() is None:
                return False
            (inserted,) = self.job_insert_many([job], now, connection=conn)
            conn.execute(_Q["periodic_tick_job"], {"name": name, "job_id": inserted.id})
        return True

    def periodic_last_ticks(self) -> dict[str, datetime]:
        rows = self._conn().execute(_Q["periodic_last_ticks"]).fetchall()
        return {name: _dt_required(tick) for name, tick in rows}

    def queue_paused(self) -> set[str]:
        return {name for name, paused in self._conn().execute(_Q["queue_list"]) if paused}

    def subscribe(self, on_change: ChangeCallback) -> Subscription:
        return DataVersionWatcher(self.path, on_change)

    def worker_register(
        self,
        worker_id: str,
        host: str,
        pid: int,
        queues: list[str],
        concurrency: int,
        now: datetime,
    ) -> None:
        params = {
            "id": worker_id,
            "host": host,
            "pid": pid,
            "queues": json.dumps(queues),
            "concurrency": concurrency,
            "now": _ts(now),
        }
        with self._write() as conn:
            conn.execute(_Q["worker_register"], params)

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> str | None:
        params = {"id": worker_id, "jobs_in_hand": jobs_in_hand, "now": _ts(now)}
        with self._write() as conn:
            row = conn.execute(_Q["worker_beat"], params).fetchone()
        return None if row is None else row[0]

    def worker_unregister(self, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(_Q["worker_unregister"], {"id": worker_id})

    def worker_prune(self, last_seen_before: datetime) -> int:
        with self._write() as conn:
            return conn.execute(_Q["worker_prune"], {"before": _ts(last_seen_before)}).rowcount

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        params = {
            "name": name,
            "holder": holder,
            "expires_at": _ts(now + ttl),
            "now": _ts(now),
        }
        with self._write() as conn:
            return conn.execute(_Q["leader_acquire"], params).fetchone() is not None

    def leader_release(self, name: str, holder: str) -> None:
        with self._write() as conn:
            conn.execute(_Q["leader_release"], {"name": name, "holder": holder})

    def _record_starts(
        self, conn: sqlite3.Connection, queues: str, ids: list[int], now_ts: float
    ) -> None:
        """A limited claim's bookkeeping: its starts, for the rates, and the starts that expired."""
        if ids:
            conn.execute(_Q["limit_record_starts"], {"ids": json.dumps(ids), "now": now_ts})
        params = {"queues": queues, "now": now_ts, "slack": LIMIT_SLACK_SECONDS}
        conn.execute(_Q["limit_prune_starts"], params)


def claim_params(ask: ClaimAsk) -> dict[str, Any]:
    """The parameters every claim statement of ``ask`` takes (to run under the write
    lock: one machine, one clock, read under the lock, so that claims' clocks run
    in commit order and a rate's window is never judged by a moment older than a
    start it counts)."""
    when = ask.now or utcnow()
    return {
        "limit": ask.limit,
        "worker": ask.worker,
        "token": secrets.token_hex(16),
        "lease_expires_at": _ts(when + ask.lease),
        "now": _ts(when),
        "group": ask.group,
    }
