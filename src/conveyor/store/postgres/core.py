"""JobStore on PostgreSQL: a job's life (insert, claim, heartbeat, finish, rescue),
periodic ticks, workers, the leader lease and change notifications.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg import errors as pg_errors

from conveyor.errors import StoreUnavailableError
from conveyor.job import Job, NewJob
from conveyor.store.claims import ClaimAsk, ClaimEntry
from conveyor.store.flows import first_states
from conveyor.store.keys import key_pairs, new_job_record, plan_insert, resolve_plan
from conveyor.store.limiting import LIMIT_SLACK_SECONDS
from conveyor.store.postgres import flows as pg_flows
from conveyor.store.postgres.base import (
    _Q,
    Connection,
    Cursor,
    PostgresBase,
    _finish_params,
    _own_cursor,
    _row_to_job,
)
from conveyor.store.postgres.expiry import write_deadlines
from conveyor.store.postgres.fair_keys import write_fair_keys
from conveyor.store.postgres.listener import Listener
from conveyor.store.postgres.replace import insert_replacing_on
from conveyor.store.postgres.retaining import write_retain
from conveyor.store.postgres.unique import holds_when_finished, lock_keys
from conveyor.store.protocols import ChangeCallback, Subscription
from conveyor.store.records import LEASE_EXPIRED_ERROR, Finish, Lease, LeaseStatus

log = logging.getLogger("conveyor.postgres")

#: Claims retried after a group race (see job_claim in queries.sql).
_CLAIM_ATTEMPTS = 5
#: How long a claim's answer to next_run_in stands in for asking (the worker asks
#: right after the claim; later, ask the database).
_NEXT_DUE_FRESH = 0.5
#: job_finish tries rows another statement held again this many times, the first
#: after _PASSED_PAUSE seconds, each pause twice the one before (0.3 s in all).
_PASSED_RETRIES = 5
_PASSED_PAUSE = 0.01
#: Inserts of one batch retried when keys change hands under it (see job_insert_many).
_INSERT_ROUNDS = 5
#: Seconds a store trusts that queues have no limits before it looks again.
LIMITS_RECHECK_SECONDS = 1.0


class CoreMixin(ClaimEntry, PostgresBase):
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
        if connection is None and any(
            new.waits
            or new.expires_at
            or new.retain
            or new.fair_key is not None
            or holds_when_finished(new)
            for new in jobs
        ):
            # Jobs that wait are linked to their parents in the insert's transaction;
            # deadlines are written in it too (no claim sees a job before its deadline),
            # and keys that finished jobs hold stay locked until it commits (unique.py).
            with self._tx() as own:
                return self.job_insert_many(jobs, now, connection=own)
        with self._conn(connection) as own:
            conn: Connection | Cursor = own if connection is None else _own_cursor(own)
            pairs = key_pairs(jobs)
            lock_keys(conn, jobs)
            plan = plan_insert(jobs, self._find_keys(conn, pairs) if pairs else [])
            inserted: dict[int, Job] = {}
            answered: set[int] = set()  # positions another producer's job answered
            pending = plan.insert
            for _ in range(_INSERT_ROUNDS):
                if not pending:
                    break
                lost = self._insert_rows(conn, jobs, pending, now, inserted)
                if not lost:
                    break
                # Another producer's job took a key after our lookup (jobs_live_key
                # refused our row): return that job, or insert again if it ended
                # in the meantime and no longer holds the key.
                subset = [jobs[p] for p in lost]
                replan = plan_insert(subset, self._find_keys(conn, key_pairs(subset)))
                for index, existing in replan.existing.items():
                    inserted[lost[index]] = existing
                    answered.add(lost[index])
                pending = [lost[index] for index in replan.insert]
            else:
                if pending:
                    # Contention, not a refusal: the enqueue may be tried again as is.
                    raise StoreUnavailableError(
                        f"enqueue gave up after {_INSERT_ROUNDS} rounds: the keys of "
                        f"{len(pending)} jobs kept changing hands; try again"
                    )
            results = resolve_plan(plan, len(jobs), inserted)
            if any(new.expires_at is not None for new in jobs):
                write_deadlines(conn, {inserted[p].id: jobs[p] for p in set(inserted) - answered})
            if any(new.retain is not None for new in jobs):
                write_retain(conn, {inserted[p].id: jobs[p] for p in set(inserted) - answered})
            if any(new.fair_key is not None for new in jobs):
                write_fair_keys(conn, {inserted[p].id: jobs[p] for p in set(inserted) - answered})
            if workflow is not None or any(new.waits for new in jobs):
                ids = [job.id for job in results]
                written = sorted(set(inserted) - answered)
                first_states(pg_flows.link(conn, jobs, ids, written, now, workflow), results)
        return results

    def _insert_rows(
        self,
        conn: Connection | Cursor,
        jobs: Sequence[NewJob],
        positions: list[int],
        now: datetime,
        inserted: dict[int, Job],
    ) -> list[int]:
        """Insert the jobs at ``positions``; record them in ``inserted``; return those refused."""
        chosen = [jobs[p] for p in positions]
        params = {
            "queues": [j.queue for j in chosen],
            "tasks": [j.task for j in chosen],
            "args": [j.args_json for j in chosen],
            "kwargs": [j.kwargs_json for j in chosen],
            "priorities": [j.priority for j in chosen],
            "run_ats": [j.run_at for j in chosen],
            "max_attempts": [j.max_attempts for j in chosen],
            "keys": [j.key for j in chosen],
            "groups": [j.group for j in chosen],
            "batches": [j.batch for j in chosen],
            "limit_keys": [j.limit_key for j in chosen],
            "headers": [j.headers_text() for j in chosen],
            "now": now,
        }
        rows = conn.execute(_Q["job_insert"], params).fetchall()
        lost: list[int] = []
        for position, (job_id, written) in zip(positions, rows, strict=True):
            if written:
                inserted[position] = new_job_record(job_id, jobs[position], now)
            else:
                lost.append(position)
        return lost

    def _find_keys(self, conn: Connection | Cursor, pairs: list[tuple[str, str]]) -> list[Job]:
        # On a caller's connection, ``conn`` is a cursor made by _own_cursor: tuples
        # and json as text, like a pooled connection.
        params = {"queues": [q for q, _ in pairs], "keys": [k for _, k in pairs]}
        return [_row_to_job(r) for r in conn.execute(_Q["job_find_keys"], params)]

    def job_get(self, job_id: int) -> Job | None:
        jobs = self._fetch_jobs("job_get", {"id": job_id})
        return jobs[0] if jobs else None

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        by_id = {j.id: j for j in self._fetch_jobs("job_get_many", {"ids": list(job_ids)})}
        return [by_id[i] for i in job_ids if i in by_id]

    def next_run_in(
        self, queues: Sequence[str], now: datetime | None = None, group: str | None = None
    ) -> float | None:
        names = tuple(dict.fromkeys(queues))
        if now is None and group is None:
            answered = self._next_due.pop(names, None)
            # The answer of the claim just made on these queues (job_claim), if
            # it is fresh and no limits came meanwhile.
            if answered is not None and time.monotonic() - answered[2] < _NEXT_DUE_FRESH:
                seconds, limited_then, _ = answered
                if not limited_then and not self._has_limits(names):
                    return None if seconds is None else max(0.0, float(seconds))
        # limit 1: next_run_in_limited asks whether one job could start.
        params = {"queues": list(names), "now": now, "group": group, "limit": 1}
        limited = self._has_limits(names)
        with self._conn() as conn:
            row = conn.execute(_Q["next_run_in_limited" if limited else "next_run_in"], params)
            answer = row.fetchone()
            if answer is not None and bool(answer[1]) != limited:
                # The queues' limits came or went since: ask the statement that fits
                # (and the next claim will be the one that fits too).
                limited = bool(answer[1])
                self._saw_limits(names, limited)
                name = "next_run_in_limited" if limited else "next_run_in"
                answer = conn.execute(_Q[name], params).fetchone()
        return None if answer is None or answer[0] is None else max(0.0, float(answer[0]))

    def _claim(self, ask: ClaimAsk) -> list[Job]:
        names, now, group = ask.queues, ask.now, ask.group
        params = {
            "queues": list(names),
            "limit": ask.limit,
            "worker": ask.worker,
            "token": secrets.token_hex(16),
            "lease": ask.lease,
            "now": now,
            "group": group,
            "slack": LIMIT_SLACK_SECONDS,
        }
        # Queues with limits go to job_claim_limited; the others to job_claim,
        # which passes limited queues by (see queries.sql).
        limited = self._has_limits(names)
        for _ in range(_CLAIM_ATTEMPTS):
            try:
                with self._conn() as conn:
                    name = "job_claim_limited" if limited else "job_claim"
                    rows = conn.execute(_Q[name], params).fetchall()
            except pg_errors.UniqueViolation:
                # Lost a group race to a concurrent claimer: look again with a new snapshot.
                continue
            if limited:
                # At least one row, whose last column says whether the queues still
                # have limits (a claim of nothing is a row of NULLs and that flag).
                self._saw_limits(names, bool(rows[0][-1]) if rows else False)
                rows = [row for row in rows if row[0] is not None]
            else:
                # A claim that took fewer than it could answered next_run_in too:
                # a row of NULLs, then next_due's two columns (see queries.sql).
                due = [row for row in rows if row[0] is None]
                rows = [row for row in rows if row[0] is not None]
                if due and now is None and group is None:
                    self._next_due[names] = (due[0][-2], bool(due[0][-1]), time.monotonic())
            jobs = [_row_to_job(row) for row in rows]
            jobs.sort(key=lambda j: (-j.priority, j.id))
            return jobs
        log.info("claim gave up after %d group races; the next poll retries", _CLAIM_ATTEMPTS)
        return []

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime | None = None
    ) -> list[LeaseStatus]:
        if not leases:
            return []
        params = {
            "ids": [le.id for le in leases],
            "tokens": [le.token for le in leases],
            "lease": lease,
            "now": now,
        }
        with self._conn() as conn:
            rows = conn.execute(_Q["job_heartbeat"], params).fetchall()
        return [LeaseStatus(id=r[0], cancel_requested=r[1], busy=r[2]) for r in rows]

    def job_finish(self, finishes: Sequence[Finish], now: datetime | None = None) -> list[int]:
        ids, passed = self._finish_once(finishes, now)
        # Rows another statement held a moment (a claim, a renewal, a cancel) are
        # tried again at once, a few times; a row still held after that belongs
        # to a longer transaction (a handler's ctx.complete before its commit),
        # which the caller must not wait for: it is left out of the answer.
        pause = _PASSED_PAUSE
        for _ in range(_PASSED_RETRIES):
            if not passed:
                break
            time.sleep(pause)
            pause *= 2
            more, passed = self._finish_once([f for f in finishes if f.id in passed], now)
            ids += more
        return ids

    def _finish_once(
        self, finishes: Sequence[Finish], now: datetime | None
    ) -> tuple[list[int], set[int]]:
        """job_finish once: the ids it changed, and those it passed over (held rows)."""
        if not finishes:
            return [], set()
        # One statement for the jobs nothing waits for; it passes by those that
        # others wait for (waited_on) and answers nothing for them, and those are
        # finished again in one transaction with the jobs waiting for them
        # (pg_flows.release). A job the first statement did not end for another
        # reason (a stale lease) is not ended by the second either: only such
        # finishes pay twice.
        with self._conn() as conn:
            rows = conn.execute(_Q["job_finish"], _finish_params(finishes, now)).fetchall()
        ids = [r[0] for r in rows if r[1]]
        passed = {r[0] for r in rows if not r[1]}
        answered = {r[0] for r in rows}
        rest = [f for f in finishes if f.id not in answered]
        if not rest:
            return ids, passed
        with self._tx() as conn:
            with conn.pipeline():
                finished = conn.execute(_Q["job_finish"], _finish_params(rest, now, flows=True))
                resolved = pg_flows.resolve(conn, [f.id for f in rest])
            rows = finished.fetchall()
            ids += [r[0] for r in rows if r[1]]
            passed |= {r[0] for r in rows if not r[1]}
            pg_flows.release_resolved(conn, resolved.fetchall(), now)
        return ids, passed

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        params = {"id": lease.id, "token": lease.token, "fraction": fraction, "message": message}
        with self._conn() as conn:
            return conn.execute(_Q["job_progress"], params).rowcount == 1

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        with self._conn() as conn:
            expired = conn.execute(
                _Q["job_expired_leases"], {"now": now, "limit": limit}
            ).fetchall()
        rescues = [
            Finish(id_, token, "rescue", error=LEASE_EXPIRED_ERROR) for id_, token in expired
        ]
        # A row held by another transaction is not waited for: the next round.
        return self._finish_once(rescues, now)[0]

    def periodic_enqueue(self, name: str, tick: datetime, job: NewJob, now: datetime) -> bool:
        with self._tx() as conn:
            params = {"name": name, "tick": tick, "now": now}
            if conn.execute(_Q["periodic_tick_take"], params).fetchone() is None:
                return False
            (inserted,) = self.job_insert_many([job], now, connection=conn)
            conn.execute(_Q["periodic_tick_job"], {"name": name, "job_id": inserted.id})
        return True

    def periodic_last_ticks(self) -> dict[str, datetime]:
        with self._conn() as conn:
            rows = conn.execute(_Q["periodic_last_ticks"]).fetchall()
        return {name: tick for name, tick in rows}

    def queue_paused(self) -> set[str]:
        with self._conn() as conn:
            return {name for name, paused in conn.execute(_Q["queue_list"]) if paused}

    def subscribe(self, on_change: ChangeCallback) -> Subscription:
        return Listener(self.dsn, on_change, self._connect_timeout)

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
            "now": now,
        }
        self._change_none("worker_register", params)

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> str | None:
        params = {"id": worker_id, "jobs_in_hand": jobs_in_hand, "now": now}
        with self._conn() as conn:
            row = conn.execute(_Q["worker_beat"], params).fetchone()
        return None if row is None else row[0]

    def worker_unregister(self, worker_id: str) -> None:
        self._change_none("worker_unregister", {"id": worker_id})

    def worker_prune(self, last_seen_before: datetime) -> int:
        return self._change_none("worker_prune", {"before": last_seen_before})

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        params = {"name": name, "holder": holder, "expires_at": now + ttl, "now": now}
        return bool(self._change("leader_acquire", params))

    def leader_release(self, name: str, holder: str) -> None:
        self._change_none("leader_release", {"name": name, "holder": holder})

    def _has_limits(self, names: tuple[str, ...]) -> bool:
        """Whether some of these queues have limits, as this store last saw it.

        "No limits" is trusted for LIMITS_RECHECK_SECONDS, then looked up again (a
        limit set elsewhere meanwhile: job_claim passes its queue by, never past
        the limit, and next_run_in, asked after a claim that took fewer than it
        could, tells at once). "Limits" is trusted until job_claim_limited says
        they are gone.
        """
        known = self._limited.get(names)
        now = time.monotonic()
        if known is not None and (known[0] or now - known[1] < LIMITS_RECHECK_SECONDS):
            return known[0]
        with self._conn() as conn:
            row = conn.execute(_Q["limit_any"], {"queues": list(names)}).fetchone()
        self._limited[names] = (bool(row and row[0]), now)
        return bool(row and row[0])
