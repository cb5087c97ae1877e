"""The SQLite store: the embedded default, one file, nothing to install.

One connection per thread (sqlite3 connections must not be shared across
threads), WAL so readers never block the writer, and ``BEGIN IMMEDIATE`` for
every write so that each read-then-write happens under SQLite's single write
lock: that is what makes a claim atomic here, where PostgreSQL needs row locks.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from conveyor.errors import ConfigurationError, JobStateError, StoreUnavailableError
from conveyor.job import Event, EventKind, Job, JobState, NewJob
from conveyor.store.base import (
    Completion,
    Failure,
    JobFilter,
    Lease,
    LeaseStatus,
    QueueStats,
    Snooze,
    Stats,
)
from conveyor.store.common import event_kind, key_pairs, plan_insert, resolve_plan
from conveyor.store.sql import load_migrations, load_queries

_Q = load_queries("conveyor.store.sqlite")
_MIGRATIONS = load_migrations("conveyor.store.sqlite")
_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # NORMAL in WAL mode survives a process crash; only a power loss can drop
    # the last transactions. FULL costs about 5x per commit on this hardware.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = OFF",
)
BUSY_TIMEOUT_SECONDS = 30.0


def _ts(value: datetime) -> float:
    return value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _row_to_job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        queue=row["queue"],
        task=row["task"],
        state=JobState(row["state"]),
        args_json=row["args"],
        kwargs_json=row["kwargs"],
        priority=row["priority"],
        run_at=datetime.fromtimestamp(row["run_at"], UTC),
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        created_at=datetime.fromtimestamp(row["created_at"], UTC),
        key=row["key"],
        group=row["group_key"],
        batch=row["batch"],
        worker=row["worker"],
        lease_token=row["lease_token"],
        lease_expires_at=_dt(row["lease_expires_at"]),
        cancel_requested=bool(row["cancel_requested"]),
        result_json=row["result"],
        error=row["error"],
        progress=row["progress"],
        progress_message=row["progress_message"],
        started_at=_dt(row["started_at"]),
        finished_at=_dt(row["finished_at"]),
    )


def _row_to_event(row: sqlite3.Row) -> Event:
    return Event(
        seq=row["seq"],
        job_id=row["job_id"],
        queue=row["queue"],
        task=row["task"],
        kind=row["kind"],
        attempt=row["attempt"],
        worker=row["worker"],
        at=datetime.fromtimestamp(row["at"], UTC),
        error=row["error"],
    )


class SQLiteStore:
    supports_listen_notify = False
    supports_external_transactions = True

    def __init__(self, path: str | Path, *, migrate: bool = True) -> None:
        self.path = Path(path)
        self.description = f"SQLite database {self.path}"
        if not self.path.parent.is_dir():
            raise ConfigurationError(
                f"cannot open {self.description}: folder {self.path.parent} does not exist"
            )
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        if migrate:
            self.migrate()

    # --- connections -----------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreUnavailableError(f"{self.description}: the store is closed")
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=BUSY_TIMEOUT_SECONDS,
                    isolation_level=None,  # we issue BEGIN ourselves
                    check_same_thread=False,  # closed from another thread by close()
                )
                conn.row_factory = sqlite3.Row
                for pragma in _PRAGMAS:
                    conn.execute(pragma)
            except sqlite3.Error as exc:
                raise StoreUnavailableError(f"cannot open {self.description}: {exc}") from exc
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _write(self, connection: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """A write transaction; with a caller's ``connection``, join its transaction instead."""
        if connection is not None:
            if not connection.in_transaction:
                raise ConfigurationError(
                    "enqueue with a connection needs an open transaction on it "
                    "(conn.execute('BEGIN IMMEDIATE') first); conveyor does not commit it"
                )
            yield connection
            return
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    def ping(self) -> None:
        self._conn().execute("SELECT 1").fetchone()

    # --- migrations -----------------------------------------------------------

    def schema_version(self) -> int:
        conn = self._conn()
        conn.execute(_Q["migrations_table"])
        version: int = conn.execute(_Q["schema_version"]).fetchone()[0]
        return version

    def migrate(self) -> int:
        conn = self._conn()
        conn.execute(_Q["migrations_table"])
        with self._write() as conn:
            # Read under the write lock: two processes starting together migrate once.
            current: int = conn.execute(_Q["schema_version"]).fetchone()[0]
            for migration in _MIGRATIONS:
                if migration.version <= current:
                    continue
                for statement in _split_statements(migration.sql):
                    conn.execute(statement)
                conn.execute(
                    _Q["migration_record"],
                    {
                        "version": migration.version,
                        "name": migration.name,
                        "now": _ts(datetime.now(UTC)),
                    },
                )
                current = migration.version
        return current

    # --- producing ------------------------------------------------------------

    def job_insert_many(
        self, jobs: Sequence[NewJob], now: datetime, connection: Any = None
    ) -> list[Job]:
        if not jobs:
            return []
        now_ts = _ts(now)
        with self._write(connection) as conn:
            pairs = key_pairs(jobs)
            found = (
                [_row_to_job(r) for r in conn.execute(_Q["job_find_keys"], {"pairs": json.dumps(pairs)})]
                if pairs
                else []
            )
            plan = plan_insert(jobs, found)
            first = conn.execute(_Q["job_max_id"]).fetchone()[0] + 1
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
                    )
                )
                inserted[position] = _new_job_record(job_id, new, now)
            if rows:
                conn.executemany(_Q["job_insert"], rows)
                conn.execute(
                    _Q["event_insert_enqueued"], {"first": first, "last": first + len(rows) - 1}
                )
        return resolve_plan(plan, len(jobs), inserted)

    # --- reading ------------------------------------------------------------

    def job_get(self, job_id: int) -> Job | None:
        row = self._conn().execute(_Q["job_get"], {"id": job_id}).fetchone()
        return None if row is None else _row_to_job(row)

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        rows = self._conn().execute(_Q["job_get_many"], {"ids": json.dumps(list(job_ids))})
        by_id = {job.id: job for job in map(_row_to_job, rows)}
        return [by_id[i] for i in job_ids if i in by_id]

    def job_list(self, filter: JobFilter) -> list[Job]:
        params = {
            "state": None if filter.state is None else str(filter.state),
            "queue": filter.queue,
            "task": filter.task,
            "batch": filter.batch,
            "before_id": filter.before_id,
            "limit": filter.limit,
        }
        return [_row_to_job(r) for r in self._conn().execute(_Q["job_list"], params)]

    def event_list(self, job_id: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_list"], {"job_id": job_id})
        return [_row_to_event(r) for r in rows]

    def event_since(self, seq: int, limit: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_since"], {"seq": seq, "limit": limit})
        return [_row_to_event(r) for r in rows]

    def stats(self, now: datetime) -> Stats:
        conn = self._conn()
        # One read transaction, so the counts and ages describe the same moment.
        conn.execute("BEGIN")
        try:
            counts = conn.execute(_Q["stats_counts"]).fetchall()
            oldest = dict(conn.execute(_Q["stats_oldest_ready"], {"now": _ts(now)}).fetchall())
            since = _ts(now - timedelta(minutes=1))
            finished = conn.execute(_Q["stats_finished_since"], {"since": since}).fetchone()[0]
            paused = {name for name, p in conn.execute(_Q["queue_list"]) if p}
        finally:
            conn.execute("COMMIT")
        per_queue: dict[str, dict[str, int]] = {}
        for queue, state, count in counts:
            per_queue.setdefault(queue, {})[state] = count
        for queue in paused:
            per_queue.setdefault(queue, {})
        return Stats(
            queues={
                name: QueueStats(
                    name=name,
                    paused=name in paused,
                    counts=dict(sorted(c.items())),
                    oldest_ready_age=(
                        max(0.0, _ts(now) - oldest[name]) if name in oldest else None
                    ),
                )
                for name, c in sorted(per_queue.items())
            },
            finished_last_minute=finished,
        )

    def next_run_at(self, queues: Sequence[str] | None) -> datetime | None:
        params = {"all_queues": queues is None, "queues": json.dumps(list(queues or []))}
        value = self._conn().execute(_Q["next_run_at"], params).fetchone()[0]
        return _dt(value)

    # --- working ------------------------------------------------------------

    def job_claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime,
        group: str | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        params = {
            "queues": json.dumps(list(queues)),
            "limit": limit,
            "worker": worker,
            "token": secrets.token_hex(16),
            "lease_expires_at": _ts(now + lease),
            "now": _ts(now),
            "group": group,
        }
        with self._write() as conn:
            jobs = [_row_to_job(r) for r in conn.execute(_Q["job_claim"], params)]
            if jobs:
                conn.executemany(
                    _Q["event_insert"],
                    [
                        (j.id, j.queue, j.task, EventKind.CLAIMED, j.attempts, worker, params["now"], None)
                        for j in jobs
                    ],
                )
        # RETURNING order is unspecified: hand jobs out in claim order.
        jobs.sort(key=lambda j: (-j.priority, j.id))
        return jobs

    def job_heartbeat(
        self, leases: Sequence[Lease], lease: timedelta, now: datetime
    ) -> list[LeaseStatus]:
        if not leases:
            return []
        params = {
            "items": json.dumps([[le.id, le.token] for le in leases]),
            "lease_expires_at": _ts(now + lease),
        }
        with self._write() as conn:
            rows = conn.execute(_Q["job_heartbeat"], params).fetchall()
        return [LeaseStatus(id=r[0], cancel_requested=bool(r[1])) for r in rows]

    def _finish(self, action: str, items: list[list[Any]], now: datetime) -> list[int]:
        """Run one of the batched lease-checked updates and record an event per changed row."""
        if not items:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            rows = conn.execute(_Q[f"job_{action}"], {"items": json.dumps(items), "now": now_ts})
            changed = rows.fetchall()
            self._record(conn, action, changed, now_ts)
        return [r[0] for r in changed]

    def _record(
        self, conn: sqlite3.Connection, action: str, changed: list[sqlite3.Row], now_ts: float
    ) -> None:
        # Rows are (id, queue, task, state, attempts, worker, error).
        # Snooze and release gave the attempt back; the event names the attempt that ran.
        attempt_offset = 1 if action in ("snooze", "release") else 0
        events = []
        for job_id, queue, task, state, attempts, worker, error in changed:
            kind = event_kind(action, state)
            attempt = attempts + attempt_offset
            events.append((job_id, queue, task, kind, attempt, worker, now_ts, error))
            if action == "rescue" and state != JobState.QUEUED:
                # A rescued job out of attempts is also failed (or cancelled): record both.
                terminal = EventKind.FAILED if state == JobState.FAILED else EventKind.CANCELLED
                events.append((job_id, queue, task, terminal, attempt, worker, now_ts, error))
        if events:
            conn.executemany(_Q["event_insert"], events)

    def job_complete(self, completions: Sequence[Completion], now: datetime) -> list[int]:
        items = [[c.id, c.token, c.result_json] for c in completions]
        return self._finish("complete", items, now)

    def job_fail(self, failures: Sequence[Failure], now: datetime) -> list[int]:
        items = [[f.id, f.token, f.error, f.retryable, _ts(f.retry_at)] for f in failures]
        return self._finish("fail", items, now)

    def job_snooze(self, snoozes: Sequence[Snooze], now: datetime) -> list[int]:
        items = [[s.id, s.token, _ts(s.run_at)] for s in snoozes]
        return self._finish("snooze", items, now)

    def job_release(self, leases: Sequence[Lease], now: datetime) -> list[int]:
        return self._finish("release", [[le.id, le.token] for le in leases], now)

    def job_set_cancelled(self, leases: Sequence[Lease], now: datetime) -> list[int]:
        return self._finish("set_cancelled", [[le.id, le.token] for le in leases], now)

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        params = {"id": lease.id, "token": lease.token, "fraction": fraction, "message": message}
        with self._write() as conn:
            return conn.execute(_Q["job_progress"], params).rowcount == 1

    def job_rescue_expired(self, now: datetime, limit: int = 1000) -> list[int]:
        now_ts = _ts(now)
        with self._write() as conn:
            changed = conn.execute(
                _Q["job_rescue_expired"], {"now": now_ts, "limit": limit}
            ).fetchall()
            self._record(conn, "rescue", changed, now_ts)
        return [r[0] for r in changed]

    # --- operating ------------------------------------------------------------

    def job_cancel(self, job_id: int, now: datetime) -> Job | None:
        now_ts = _ts(now)
        params = {"id": job_id, "now": now_ts}
        with self._write() as conn:
            changed = conn.execute(_Q["job_cancel_queued"], params).fetchall()
            if not changed:
                changed = conn.execute(_Q["job_cancel_running"], params).fetchall()
            self._record(conn, "cancel", changed, now_ts)
            row = conn.execute(_Q["job_get"], {"id": job_id}).fetchone()
        return None if row is None else _row_to_job(row)

    def job_retry(self, job_id: int, now: datetime) -> Job | None:
        now_ts = _ts(now)
        with self._write() as conn:
            changed = conn.execute(_Q["job_retry"], {"id": job_id, "now": now_ts}).fetchall()
            row = conn.execute(_Q["job_get"], {"id": job_id}).fetchone()
            if row is None:
                return None
            if not changed:
                raise _retry_refusal(_row_to_job(row))
            self._record(conn, "retry", changed, now_ts)
        return _row_to_job(row)

    def job_purge(self, finished_before: datetime, limit: int = 10_000) -> int:
        with self._write() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    _Q["job_purge_select"], {"before": _ts(finished_before), "limit": limit}
                )
            ]
            if ids:
                encoded = json.dumps(ids)
                conn.execute(_Q["event_delete_for_jobs"], {"ids": encoded})
                conn.execute(_Q["job_delete"], {"ids": encoded})
        return len(ids)

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, True, now)

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, False, now)

    def _set_paused(self, queue: str, paused: bool, now: datetime) -> None:
        with self._write() as conn:
            conn.execute(_Q["queue_set_paused"], {"name": queue, "paused": paused, "now": _ts(now)})

    def queue_paused(self) -> set[str]:
        return {name for name, paused in self._conn().execute(_Q["queue_list"]) if paused}


def _retry_refusal(job: Job) -> Exception:
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        return JobStateError(
            f"job {job.id} cannot be retried: another live job in queue {job.queue!r} "
            f"holds its key {job.key!r}"
        )
    return JobStateError(
        f"job {job.id} is {job.state}; only failed or cancelled jobs can be retried"
    )


def _new_job_record(job_id: int, new: NewJob, now: datetime) -> Job:
    """The Job a fresh insert produced, built without reading it back."""
    return Job(
        id=job_id,
        queue=new.queue,
        task=new.task,
        state=JobState.QUEUED,
        args_json=new.args_json,
        kwargs_json=new.kwargs_json,
        priority=new.priority,
        run_at=new.run_at,
        attempts=0,
        max_attempts=new.max_attempts,
        created_at=now,
        key=new.key,
        group=new.group,
        batch=new.batch,
    )


def _split_statements(script: str) -> list[str]:
    """Split a migration into statements, the way sqlite3 itself sees their ends."""
    statements: list[str] = []
    current = ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            if current.strip():
                statements.append(current.strip())
            current = ""
    if current.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in current.splitlines()
    ):
        raise ValueError(f"migration ends in an incomplete statement: {current.strip()[:80]}")
    return statements

