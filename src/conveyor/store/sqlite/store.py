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
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from conveyor.errors import (
    ConfigurationError,
    SchemaMissingError,
    StoreUnavailableError,
)
from conveyor.job import HOLD_AT, Event, Job, JobState, NewJob, utcnow
from conveyor.limits import Limit, QueueLimits
from conveyor.store.base import (
    LEASE_EXPIRED_ERROR,
    TAKEN_BACK_ERROR,
    BatchStatus,
    ChangeCallback,
    EventCounts,
    EventOffset,
    Finish,
    FinishedCount,
    JobSelection,
    Lease,
    LeaseStatus,
    LimitStatus,
    Relative,
    RunTimeBucket,
    Stats,
    Step,
    Subscription,
    WorkerInfo,
    WorkflowInfo,
)
from conveyor.store.boundary import translate_errors
from conveyor.store.columns import EVENT_COLUMNS, JOB_COLUMNS
from conveyor.store.counting import assemble_stats
from conveyor.store.event_kinds import EVENT_KINDS
from conveyor.store.flows import first_states
from conveyor.store.keys import key_pairs, new_job_record, plan_insert, resolve_plan
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_status, limits_of_row
from conveyor.store.selection import (
    NO_ID_BOUND,
    count_query,
    driven,
    keep_state,
    newest_first,
    select_queries,
)
from conveyor.store.sql import Migration, load_migrations, load_queries
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.watcher import DataVersionWatcher

_Q = load_queries("conveyor.store.sqlite")
#: A count no claim reaches (SQLite's 32-bit "no limit").
_NO_LIMIT = 2**31 - 1
#: Retention per final state, holding jobs back, outcome readers.
_S = load_queries("conveyor.store.sqlite", "seeds.sql")
_MIGRATIONS = load_migrations("conveyor.store.sqlite")
_E = load_queries("conveyor.store.sqlite", "steps.sql")
_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    # NORMAL in WAL mode survives a process crash; only a power loss can drop
    # the last transactions. FULL costs about 5x per commit on this hardware.
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = OFF",
    # 64 MiB of page cache per connection (the default is 2 MiB): the claim and
    # acknowledgement touch index pages all over a big jobs table, and re-reading
    # them from the OS cost about an eighth of a claim. Only pages read use memory.
    "PRAGMA cache_size = -65536",
    # A commit that finds the write-ahead log over this many pages copies it into
    # the database file and syncs, holding the write lock meanwhile: 15 ms here,
    # the p99 of a worker's wake-up latency. Watchers (every process with a
    # worker or a waiter) do it in the background every quarter second instead;
    # this threshold (16 MiB) is the fallback when no process watches.
    "PRAGMA wal_autocheckpoint = 4000",
)
BUSY_TIMEOUT_SECONDS = 30.0
#: A write that waited longer than this for the write lock makes the next rescue
#: round give up (job_rescue_expired): the lease holders' renewals were waiting too.
#: A renewal every third of the lease misses it only when held up for two thirds:
#: 0.5 s covers leases down to 0.75 s, and stays clear of a busy machine's
#: ordinary waits (a checkpoint holds the lock about 15 ms).
RESCUE_LOCK_WAIT = 0.5


def _ts(value: datetime) -> float:
    return value.timestamp()


def _dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


# Rows come back as plain tuples (much cheaper than sqlite3.Row on the claim
# path): in the order of conveyor.store.columns, checked by migrate().


def _row_to_job(row: tuple[Any, ...]) -> Job:
    (
        id_, queue, task, state, args, kwargs, priority, run_at, attempts, max_attempts, key,
        group, batch, worker, token, lease_expires_at, cancel_requested, result, error, progress,
        progress_message, created_at, started_at, finished_at, limit_key, headers,
    ) = row[:26]  # fmt: skip
    return Job(
        id_, queue, task, JobState(state), args, kwargs, priority,
        datetime.fromtimestamp(run_at, UTC), attempts, max_attempts,
        datetime.fromtimestamp(created_at, UTC), key, group, batch, worker, token,
        _dt(lease_expires_at), bool(cancel_requested), result, error, progress, progress_message,
        _dt(started_at), _dt(finished_at), limit_key, headers,
    )  # fmt: skip


def _row_to_event(row: tuple[Any, ...]) -> Event:
    seq, job_id, queue, task, kind, attempt, worker, at, error = row[:9]
    return Event(seq, job_id, queue, task, kind, attempt, worker, _dt_required(at), error)


def _finish(conn: sqlite3.Connection, finishes: Sequence[Finish], now_ts: float) -> list[int]:
    """End running jobs with job_finish and record their events, and let the jobs waiting
    for them go on (workflows), in ``conn``'s transaction."""
    items = [
        [f.id, f.token, f.kind, f.result_json, f.error, None if f.run_at is None else _ts(f.run_at)]
        for f in finishes
    ]
    kinds = {f.id: f.kind for f in finishes}
    params = {"items": json.dumps(items), "now": now_ts}
    ids = [r[0] for r in conn.execute(_Q["job_finish"], params)]
    if ids:
        changed = json.dumps([[i, kinds[i]] for i in ids])
        conn.execute(_Q["event_insert_finished"], {"items": changed, "now": now_ts})
        sqlite_flows.release(conn, ids, now_ts)  # jobs waiting for these
    return ids


def _row_to_step(row: tuple[Any, ...]) -> Step:
    name, result, attempt, started_at, finished_at = row[:5]
    return Step(name, result, attempt, _dt_required(started_at), _dt_required(finished_at))


def _dt_required(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def _missing_table(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc)


def _away(exc: BaseException) -> str | None:
    """Why SQLite cannot take this call for now, when the error says so; None otherwise.

    A full disk (or a file at its ``max_page_count``) and a failing disk are
    outages, not the database refusing the data: the same write fits once
    there is room again. Told by the error code, the text where there is none.
    """
    if not isinstance(exc, sqlite3.OperationalError):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    text = str(exc)
    if primary == sqlite3.SQLITE_FULL or "database or disk is full" in text:
        return f"is full ({text}): free disk space"
    if primary == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
        return f"cannot be written ({text})"
    if _is_busy(exc):
        return f"is locked by another process ({text})"
    return None


@translate_errors(_missing_table, _away)
class SQLiteStore:
    #: TransactionalStore: enqueue inside the caller's transaction on this connection.
    transaction_connection = "a sqlite3 Connection"

    #: SqlStore: the Spark data source builds its tables beside the jobs'.
    sql_dialect = "sqlite"

    @property
    def database_file(self) -> Path:
        """LocalFileStore: the one file every process of this store opens."""
        return self.path

    def __init__(
        self, path: str | Path, *, migrate: bool = True, busy_timeout: float = BUSY_TIMEOUT_SECONDS
    ) -> None:
        self.path = Path(path)
        #: Seconds a write waits for another process's write lock before giving up.
        self.busy_timeout = busy_timeout
        self.description = f"SQLite database {self.path}"
        if not self.path.parent.is_dir():
            raise ConfigurationError(
                f"cannot open {self.description}: folder {self.path.parent} does not exist"
            )
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        # SQLite has one writer at a time. Threads of this process queue for it
        # here, handed over at once, instead of in SQLite's busy handler, which
        # sleeps 1, 2, 5, 10... ms between tries: with a worker's claims and
        # acknowledgements in two threads, those sleeps were most of its time.
        # Other processes still meet the busy timeout.
        self._writer = threading.Lock()
        #: A write waited over RESCUE_LOCK_WAIT for the lock since the last rescue round.
        self._lock_waited = False
        #: The last rescue round was given up for that.
        self._rescue_waited = False
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
                    timeout=self.busy_timeout,
                    isolation_level=None,  # we issue BEGIN ourselves
                    check_same_thread=False,  # closed from another thread by close()
                )
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
        asked = time.monotonic()
        if not self._writer.acquire(timeout=self.busy_timeout):
            raise StoreUnavailableError(
                f"{self.description} is locked: another thread of this process held the "
                f"write lock for over {self.busy_timeout:g}s"
            )
        try:
            with immediate_transaction(conn):
                if time.monotonic() - asked > RESCUE_LOCK_WAIT:
                    self._lock_waited = True  # see job_rescue_expired
                yield conn
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            # Another process held the write lock past the busy timeout (a backup,
            # a VACUUM, a long transaction): the database is away for now, not
            # refusing this data. Callers that retry (the worker) wait and retry.
            raise StoreUnavailableError(
                f"{self.description} is locked: another process held the write lock "
                f"for over {self.busy_timeout:g}s ({exc})"
            ) from exc
        finally:
            self._writer.release()

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
            current = self._apply_migrations(
                conn, _MIGRATIONS, _Q["schema_version"], _Q["migration_record"]
            )
            _check_columns(conn, "jobs", JOB_COLUMNS)
            _check_columns(conn, "events", EVENT_COLUMNS)
        return current

    @staticmethod
    def _apply_migrations(
        conn: sqlite3.Connection, migrations: Sequence[Migration], version: str, record: str
    ) -> int:
        """Apply the migrations above the version ``version`` reads, recording each with ``record``.

        Called in a write transaction. Also how a layer above the store runs a
        migration line of its own tables, with its own version table.
        """
        current: int = conn.execute(version).fetchone()[0]
        for migration in migrations:
            if migration.version <= current:
                continue
            for statement in _split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(
                record,
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
        self,
        jobs: Sequence[NewJob],
        now: datetime,
        connection: Any = None,
        *,
        workflow: str | None = None,
    ) -> list[Job]:
        if not jobs:
            return []
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
                conn.executemany(_Q["job_insert"], rows)
                conn.execute(
                    _Q["event_insert_enqueued"], {"first": first, "last": first + len(rows) - 1}
                )
            results = resolve_plan(plan, len(jobs), inserted)
            if workflow is not None or any(new.waits for new in jobs):
                ids = [job.id for job in results]
                linked = sqlite_flows.link(conn, jobs, ids, plan.insert, now_ts, workflow)
                first_states(linked, results)
        return results

    # --- reading ------------------------------------------------------------

    def job_get(self, job_id: int) -> Job | None:
        row = self._conn().execute(_Q["job_get"], {"id": job_id}).fetchone()
        return None if row is None else _row_to_job(row)

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        rows = self._conn().execute(_Q["job_get_many"], {"ids": json.dumps(list(job_ids))})
        by_id = {job.id: job for job in map(_row_to_job, rows)}
        return [by_id[i] for i in job_ids if i in by_id]

    def event_list(self, job_id: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_list"], {"job_id": job_id})
        return [_row_to_event(r) for r in rows]

    def event_since(self, seq: int, limit: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_since"], {"seq": seq, "limit": limit})
        return [_row_to_event(r) for r in rows]

    def stats(self, now: datetime) -> Stats:
        self._fold_finished_counts()
        conn = self._conn()
        # One read transaction, so the counts and ages describe the same moment.
        conn.execute("BEGIN")
        try:
            counts = conn.execute(_Q["stats_counts"]).fetchall()
            counts += [(q, "waiting", n) for q, n in sqlite_flows.waiting_counts(conn)]
            queued = conn.execute(_Q["stats_queued"], {"now": _ts(now)}).fetchall()
            retrying = dict(conn.execute(_Q["stats_retrying"], {"now": _ts(now)}).fetchall())
            since = _ts(now - timedelta(minutes=1))
            finished = conn.execute(_Q["stats_finished_since"], {"since": since}).fetchone()[0]
            paused = {name for name, p in conn.execute(_Q["queue_list"]) if p}
            limits = self._limit_usage(conn, now)
        finally:
            conn.execute("COMMIT")
        return assemble_stats(
            counts, queued, retrying, paused, lambda oldest: _ts(now) - oldest, finished, limits
        )

    def _fold_finished_counts(self) -> None:
        """Add the finishes recorded since the last fold to finished_counts.

        Stats read the table plus the events after its offset, and are exact
        either way: folding keeps that tail short. A short write, none when
        nothing happened since the last fold, and skipped when another writer
        holds the lock (a long purge, a migration): stats never wait for it.
        """
        conn = self._conn()
        folded, newest = conn.execute(_Q["finished_counts_offset"]).fetchone()
        if newest <= folded or not self._writer.acquire(blocking=False):
            return
        try:
            conn.execute("PRAGMA busy_timeout = 0")  # another process's write: skip
            with immediate_transaction(conn):
                # Read again under the write lock: another process may have folded.
                folded, newest = conn.execute(_Q["finished_counts_offset"]).fetchone()
                if newest > folded:
                    conn.execute(_Q["finished_counts_fold"], {"upto": newest})
                    conn.execute(_Q["finished_counts_fold_offset"], {"upto": newest})
                    conn.execute(_Q["finished_counts_prune"])
        except sqlite3.OperationalError as exc:
            # Locked by another process, or no room to write the fold (a full
            # disk): stats are exact without it, and read what they can.
            if _away(exc) is None:
                raise
        finally:
            # Back to the store's own wait (milliseconds: an integer we made).
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            self._writer.release()

    def _delete_jobs(self, conn: sqlite3.Connection, ids: list[int]) -> None:
        """Delete jobs and their events, their counts with them (in the caller's transaction)."""
        if not ids:
            return
        encoded = json.dumps(ids)
        sqlite_flows.forget(conn, encoded)
        conn.execute(_Q["finished_counts_forget"], {"ids": encoded})
        conn.execute(_Q["event_delete_for_jobs"], {"ids": encoded})
        conn.execute(_Q["job_delete"], {"ids": encoded})

    def _states(self, conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Each job's (queue, state), read in the caller's write transaction."""
        rows = conn.execute(_Q["job_states"], {"ids": json.dumps(list(ids))})
        return {job_id: (queue, state) for job_id, queue, state in rows}

    def _uncount(self, conn: sqlite3.Connection, left: list[tuple[str, str]]) -> None:
        """Take jobs off the finished (queue, state) counts they left (a manual retry)."""
        if left:
            deltas = json.dumps([[queue, state, -1] for queue, state in left])
            conn.execute(_Q["finished_counts_add"], {"deltas": deltas})

    def batch_status(self, batch: str) -> BatchStatus:
        rows = self._conn().execute(_Q["batch_counts"], {"batch": batch}).fetchall()
        return BatchStatus(batch, {state: count for state, count in sorted(rows)})

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

    # --- working ------------------------------------------------------------

    def job_claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker: str,
        lease: timedelta,
        now: datetime | None = None,
        group: str | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        # Named twice, a queue would be scanned twice and its jobs counted twice.
        names = json.dumps(list(dict.fromkeys(queues)))
        token = secrets.token_hex(16)
        with self._write() as conn:
            # One machine, one clock: the file's users share it. Read under the
            # write lock, so that claims' clocks run in commit order and a rate's
            # window is never judged by a moment older than a start it counts.
            when = now or utcnow()
            params = {
                "queues": names,
                "limit": limit,
                "worker": worker,
                "token": token,
                "lease_expires_at": _ts(when + lease),
                "now": _ts(when),
                "group": group,
            }
            limited = conn.execute(_Q["limit_any"], {"queues": names}).fetchone() is not None
            if not limited:  # the plain claim, as if limits did not exist
                jobs = [_row_to_job(r) for r in conn.execute(_Q["job_claim"], params)]
            else:
                jobs = [_row_to_job(r) for r in conn.execute(_Q["job_claim_limited"], params)]
                self._record_starts(conn, names, [j.id for j in jobs], _ts(when))
        # RETURNING order is unspecified: hand jobs out in claim order.
        jobs.sort(key=lambda j: (-j.priority, j.id))
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

    def _record(self, conn: sqlite3.Connection, action: str, ids: list[int], now_ts: float) -> None:
        """Append the events of ``action`` for the jobs it just changed (same transaction)."""
        if not ids:
            return
        params = {"ids": json.dumps(ids), "kinds": json.dumps(EVENT_KINDS[action]), "now": now_ts}
        conn.execute(_Q["event_insert_for_jobs"], params)

    def job_progress(
        self, lease: Lease, fraction: float | None, message: str | None, now: datetime
    ) -> bool:
        params = {"id": lease.id, "token": lease.token, "fraction": fraction, "message": message}
        with self._write() as conn:
            return conn.execute(_Q["job_progress"], params).rowcount == 1

    def job_rescue_expired(self, now: datetime | None = None, limit: int = 1000) -> list[int]:
        with self._write() as conn:
            waited, self._lock_waited = self._lock_waited, False
            if waited and not self._rescue_waited:
                # A write of this process (this round's own, or the maintenance
                # round's before it) waited for another transaction's write lock:
                # a handler's ctx.complete before its commit, a backup. The
                # workers' renewals waited for it too, and leases ran out meanwhile
                # that no worker could renew. This round is given up, so that
                # those renewals, queued for the lock as well, come first; the
                # next round rescues what is still expired. Never twice in a row:
                # on a database always that busy, dead workers' jobs still come back.
                self._rescue_waited = True
                return []
            self._rescue_waited = False
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

    # --- operating ------------------------------------------------------------

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        now_ts = _ts(now)
        params = {"queue": queue, "before": _ts(failed_before), "now": now_ts, "limit": limit}
        with self._write() as conn:
            rows = conn.execute(_Q["job_retry_failed"], params).fetchall()
            ids = [job_id for job_id, _ in rows]
            self._uncount(conn, [(queue, JobState.FAILED.value) for _, queue in rows])
            self._record(conn, "retry", ids, now_ts)
        return ids

    def job_delete_terminal(self, job_ids: Sequence[int], finished_before: datetime) -> list[int]:
        if not job_ids:
            return []
        params = {"ids": json.dumps(list(job_ids)), "before": _ts(finished_before)}
        with self._write() as conn:
            # Selected under the write lock: no retry can slip in before the delete.
            ids = [r[0] for r in conn.execute(_Q["job_delete_terminal_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return ids

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, True, now)

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, False, now)

    def _set_paused(self, queue: str, paused: bool, now: datetime) -> None:
        with self._write() as conn:
            conn.execute(_Q["queue_set_paused"], {"name": queue, "paused": paused, "now": _ts(now)})

    def queue_paused(self) -> set[str]:
        return {name for name, paused in self._conn().execute(_Q["queue_list"]) if paused}

    # --- workers and maintenance ------------------------------------------------

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

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> None:
        params = {"id": worker_id, "jobs_in_hand": jobs_in_hand, "now": _ts(now)}
        with self._write() as conn:
            conn.execute(_Q["worker_beat"], params)

    def worker_unregister(self, worker_id: str) -> None:
        with self._write() as conn:
            conn.execute(_Q["worker_unregister"], {"id": worker_id})

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row[0],
                host=row[1],
                pid=row[2],
                queues=json.loads(row[3]),
                concurrency=row[4],
                jobs_in_hand=row[5],
                started_at=_dt_required(row[6]),
                last_seen_at=_dt_required(row[7]),
            )
            for row in self._conn().execute(_Q["worker_list"])
        ]

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

    # --- the dashboard and metrics ------------------------------------------------

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        params = {"since": _ts(since), "slot": slot.total_seconds()}
        rows = self._conn().execute(_Q["stats_finished_per_slot"], params)
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for q, s, i, c in rows]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        rows = self._conn().execute(_Q["event_count_by_kind"], {"after_seq": after[1]})
        counts: dict[tuple[str, str], int] = {}
        last = after[1]
        for queue, kind, count, max_seq in rows:
            counts[(queue, kind)] = count
            last = max(last, max_seq)
        return EventCounts(counts=counts, offset=(0, last))

    def queue_names(self) -> list[str]:
        return [row[0] for row in self._conn().execute(_Q["queue_names"])]

    def event_offset(self) -> EventOffset:
        xid, seq = self._conn().execute(_Q["event_offset"]).fetchone()
        return (int(xid), int(seq))

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        params = {
            "after": _ts(finished_after),
            "until": _ts(finished_until),
            "bounds": json.dumps(list(bounds)),
        }
        rows = self._conn().execute(_Q["job_run_time_histogram"], params)
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=float(s)) for q, b, c, s in rows
        ]

    # --- operating in bulk, groups, retention and the operator's views ------------

    def schema_latest(self) -> int:
        return _MIGRATIONS[-1].version

    def _selection_params(self, params: dict[str, Any], now: datetime) -> dict[str, Any]:
        ids = params.get("ids")
        return {**params, "ids": None if ids is None else json.dumps(ids), "now": _ts(now)}

    def job_select(
        self,
        selection: JobSelection,
        now: datetime,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Job]:
        conn = self._conn()
        pages = [
            [
                _row_to_job(r)
                for r in conn.execute(
                    driven(_Q, "job_select", driver), self._selection_params(params, now)
                )
            ]
            for driver, params in select_queries(
                selection, before_id, limit, self.queue_names, self._newest_id
            )
        ]
        return newest_first(pages, limit)

    def _newest_id(self) -> int:
        newest: int = self._conn().execute(_Q["job_newest_id"]).fetchone()[0]
        return newest

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        driver, params = count_query(selection, self._newest_id)
        statement = driven(_Q, "job_count", driver)
        rows = self._conn().execute(statement, self._selection_params(params, now)).fetchall()
        return keep_state(dict(rows), selection.state)

    def _change_many(
        self, name: str, action: str | None, job_ids: Sequence[int], now: datetime
    ) -> list[int]:
        """Run a statement on the jobs of ``job_ids`` and record ``action``'s events."""
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = sorted(r[0] for r in conn.execute(_Q[name], params))
            if action is not None:
                self._record(conn, action, ids, now_ts)
        return ids

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            before = self._states(conn, job_ids)
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = sorted(r[0] for r in conn.execute(_Q["job_retry_many"], params))
            self._uncount(conn, [before[i] for i in ids])
            self._record(conn, "retry", ids, now_ts)
        return ids

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = [r[0] for r in conn.execute(_Q["job_cancel_many_queued"], params)]
            ids += [r[0] for r in conn.execute(_Q["job_cancel_many_running"], params)]
            ids.sort()
            self._record(conn, "cancel", ids, now_ts)
            # Waiting jobs, and the jobs waiting for the jobs cancelled now.
            ids = sorted(ids + sqlite_flows.cancel_waiting(conn, job_ids, now_ts))
            sqlite_flows.release(conn, ids, now_ts)
        return ids

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        if not job_ids:
            return []
        with self._write() as conn:
            params = {"ids": json.dumps(list(job_ids))}
            ids = sorted(r[0] for r in conn.execute(_Q["job_delete_many_select"], params))
            sqlite_flows.orphan(conn, ids, _ts(utcnow()))  # the jobs waiting for them go on
            self._delete_jobs(conn, ids)
        return ids

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._change_many("job_run_now", "run_now", job_ids, now)

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        params = {"ids": json.dumps(list(job_ids))}
        held = self._conn().execute(_Q["job_running_leases"], params).fetchall()
        finishes = [Finish(i, token, "take_back", error=TAKEN_BACK_ERROR) for i, token in held]
        return self.job_finish(finishes, now)

    def job_purge_where(
        self,
        finished_before: datetime,
        states: Sequence[str],
        queue: str | None,
        limit: int = 10_000,
    ) -> int:
        params = {
            "before": _ts(finished_before),
            "states": json.dumps(list(states)),
            "queue": queue,
            "limit": limit,
        }
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(_Q["job_purge_where_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return len(ids)

    def job_purge_count(
        self, finished_before: datetime, states: Sequence[str], queue: str | None
    ) -> int:
        params = {
            "before": _ts(finished_before),
            "states": json.dumps(list(states)),
            "queue": queue,
        }
        count: int = self._conn().execute(_Q["job_purge_count"], params).fetchone()[0]
        return count

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        params = {"queue": queue, "keep": keep, "limit": limit, "states": json.dumps(list(states))}
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(_Q["job_purge_beyond_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return len(ids)

    def job_hold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_hold", "hold", job_ids, now)

    def job_unhold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_unhold", "unhold", job_ids, now)

    def _hold(self, name: str, action: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        now_ts = _ts(now)
        params = {"ids": json.dumps(list(job_ids)), "now": now_ts, "hold_at": _ts(HOLD_AT)}
        with self._write() as conn:
            ids = sorted(r[0] for r in conn.execute(_S[name], params))
            self._record(conn, action, ids, now_ts)
        return ids

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        params = {
            "queue": queue, "hold_at": _ts(HOLD_AT), "limit": limit,
            "before_id": before_id if before_id is not None else NO_ID_BOUND,
        }  # fmt: skip
        return [r[0] for r in self._conn().execute(_S["job_held"], params)]

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        params = {
            "queue": queue, "states": json.dumps(list(states)), "since": _ts(since),
            "limit": limit,
        }  # fmt: skip
        return [r[0] for r in self._conn().execute(_S["job_unprocessed"], params)]

    def job_mark_processed(self, job_id: int) -> bool:
        with self._write() as conn:
            return conn.execute(_S["job_mark_processed"], {"id": job_id}).rowcount == 1

    def queue_delete(self, queue: str) -> None:
        with self._write() as conn:
            conn.execute(_Q["queue_delete"], {"name": queue})

    # --- workflows: jobs that wait for other jobs -----------------------------------

    def job_parents(self, job_id: int) -> list[Relative]:
        rows = sqlite_flows.relatives(self._conn(), job_id, children=False)
        return _relatives(rows)

    def job_children(self, job_id: int) -> list[Relative]:
        rows = sqlite_flows.relatives(self._conn(), job_id, children=True)
        return _relatives(rows)

    def job_workflow(self, job_id: int) -> str | None:
        row = self._conn().execute(sqlite_flows.Q["job_workflow"], {"id": job_id}).fetchone()
        return None if row is None else row[0]

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        with self._write() as conn:
            params = {"id": workflow_id, "name": name, "jobs": len(jobs), "now": _ts(now)}
            if conn.execute(sqlite_flows.Q["workflow_create"], params).fetchone() is None:
                return self._workflow_jobs(conn, workflow_id), True
            return self.job_insert_many(jobs, now, conn, workflow=workflow_id), False

    def _workflow_jobs(self, conn: sqlite3.Connection, workflow_id: str) -> list[Job]:
        rows = conn.execute(sqlite_flows.Q["workflow_jobs"], {"id": workflow_id})
        return [_row_to_job(r) for r in rows]

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None:
        row = self._conn().execute(sqlite_flows.Q["workflow_get"], {"id": workflow_id}).fetchone()
        return None if row is None else WorkflowInfo(row[0], row[1], row[2], _dt_required(row[3]))

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_list"], {"limit": limit})
        return [WorkflowInfo(r[0], r[1], r[2], _dt_required(r[3])) for r in rows]

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        return self._workflow_jobs(self._conn(), workflow_id)

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_counts"], {"id": workflow_id})
        return {state: count for state, count in sorted(rows)}

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        rows = self._conn().execute(sqlite_flows.Q["workflow_edges"], {"id": workflow_id})
        return [(child, parent, resolved) for child, parent, resolved in rows]

    # --- flow control: rate and concurrency limits --------------------------------

    def _record_starts(
        self, conn: sqlite3.Connection, queues: str, ids: list[int], now_ts: float
    ) -> None:
        """A limited claim's bookkeeping: its starts, for the rates, and the starts that expired."""
        if ids:
            conn.execute(_Q["limit_record_starts"], {"ids": json.dumps(ids), "now": now_ts})
        params = {"queues": queues, "now": now_ts, "slack": LIMIT_SLACK_SECONDS}
        conn.execute(_Q["limit_prune_starts"], params)

    def limit_set(
        self, queue: str, limit: Limit | None, per_key: bool, now: datetime
    ) -> QueueLimits | None:
        rate = limit.rate if limit is not None else None
        params = {
            "queue": queue,
            "scope": "key" if per_key else "queue",
            "rate": rate.count if rate is not None else None,
            "per": rate.per if rate is not None else None,
            "concurrency": limit.concurrency if limit is not None else None,
            "now": _ts(now),
        }
        with self._write() as conn:
            conn.execute(_Q["limit_set"], params)
            conn.execute(_Q["limit_forget_empty"], {"queue": queue, "now": _ts(now)})
            row = conn.execute(_Q["limit_get"], {"queue": queue}).fetchone()
        return None if row is None else limits_of_row(row, _dt)

    def limit_get(self, queue: str) -> QueueLimits | None:
        row = self._conn().execute(_Q["limit_get"], {"queue": queue}).fetchone()
        return None if row is None else limits_of_row(row, _dt)

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        with self._write() as conn:
            when = now or utcnow()
            params = {
                "queue": queue,
                "key": limit_key,
                "until": _ts(when + timedelta(seconds=seconds)),
                "now": _ts(when),
            }
            if seconds <= 0:  # lift it
                conn.execute(_Q["limit_lift_queue" if limit_key is None else "limit_lift_key"],
                             params)  # fmt: skip
                conn.execute(_Q["limit_forget_empty"], params)
                return when
            if limit_key is None:
                until = conn.execute(_Q["limit_throttle_queue"], params).fetchone()[0]
            else:
                conn.execute(_Q["limit_ensure"], params)
                until = conn.execute(_Q["limit_throttle_key"], params).fetchone()[0]
        return _dt_required(until)

    def _limit_usage(self, conn: sqlite3.Connection, now: datetime) -> list[LimitStatus]:
        rows = conn.execute(_Q["limit_usage"], {"now": _ts(now)}).fetchall()
        return [limit_status(limits_of_row(row[:8], _dt), now, *row[8:]) for row in rows]

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        conn = self._conn()
        conn.execute("BEGIN")  # one read transaction: every figure of one moment
        try:
            return self._limit_usage(conn, now)
        finally:
            conn.execute("COMMIT")

    def limit_prune(self, now: datetime) -> None:
        params = {"now": _ts(now), "slack": LIMIT_SLACK_SECONDS}
        with self._write() as conn:
            conn.execute(_Q["limit_prune_all_starts"], params)
            conn.execute(_Q["limit_prune_throttles"], params)
            conn.execute(_Q["limit_prune_rows"], params)

    # --- exactly-once effects (docs/effects.md) -----------------------------------

    def job_complete_in(
        self, lease: Lease, result_json: str, connection: Any, now: datetime | None = None
    ) -> bool:
        # The worker's own finish of a success, in the caller's transaction.
        conn = self._caller_transaction(connection)
        success = Finish.complete(lease.id, lease.token, result_json)
        return bool(_finish(conn, [success], _ts(now or utcnow())))

    def _caller_transaction(self, connection: Any) -> sqlite3.Connection:
        """The caller's connection, checked: a sqlite3 one, on this file, in a transaction."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigurationError(
                f"ctx.complete needs a sqlite3 Connection to {self.path}, "
                f"got {type(connection).__name__}"
            )
        files = [row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"]
        if not files or not files[0] or Path(files[0]).resolve() != self.path.resolve():
            raise ConfigurationError(
                f"ctx.complete needs a connection to {self.path}, the queue's database; "
                f"this one is connected to {files[0] if files and files[0] else 'memory'}"
            )
        if not connection.in_transaction:
            raise ConfigurationError(
                "ctx.complete needs an open transaction on the connection: write your "
                "effect first (or run BEGIN IMMEDIATE), then commit after ctx.complete"
            )
        return connection

    def step_list(self, job_id: int) -> list[Step]:
        rows = self._conn().execute(_E["step_list"], {"job_id": job_id})
        return [_row_to_step(r) for r in rows]

    def step_record(
        self,
        lease: Lease,
        name: str,
        result_json: str,
        started_at: datetime,
        now: datetime | None = None,
    ) -> Step | None:
        params = {
            "id": lease.id,
            "token": lease.token,
            "name": name,
            "result": result_json,
            "started_at": _ts(started_at),
            "now": _ts(now or utcnow()),
        }
        with self._write() as conn:
            row = conn.execute(_E["step_record"], params).fetchone()
            if row is None:
                # Recorded already (kept), or the lease is gone (None).
                row = conn.execute(_E["step_get"], {"job_id": lease.id, "name": name}).fetchone()
        return None if row is None else _row_to_step(row)

    def session(self) -> Any:
        """Public access to this store's connections, for a layer built on top of it.

        A ``SQLiteSession`` (typed as ``Any`` here so that this file need not import it).
        """
        from conveyor.store.sqlite.session import SQLiteSession

        return SQLiteSession(self)


@contextmanager
def immediate_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A transaction under SQLite's write lock: what it reads stays true until it commits."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # A full disk or an I/O error can make SQLite roll the transaction back
        # itself (and a COMMIT that failed may leave it open): end what is left,
        # so the connection's next BEGIN works and the caller sees the first error.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether SQLite gave up waiting for a lock (as opposed to refusing the statement)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _check_columns(conn: sqlite3.Connection, table: str, expected: tuple[str, ...]) -> None:
    """Rows are read by position: the table must start with the columns this code expects."""
    names = tuple(row[1] for row in conn.execute("SELECT * FROM pragma_table_info(?)", (table,)))
    if names[: len(expected)] != expected:
        raise SchemaMissingError(
            f"table {table} has columns {names}; this code expects {expected}: "
            "run `conveyor migrate` with this version of conveyor"
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


def _relatives(rows: list[Any]) -> list[Relative]:
    """Relatives from rows of a job's columns, then the relative's id and the edge's
    resolution; a parent deleted since has NULL columns (no job)."""
    return [Relative(r[-2], None if r[0] is None else _row_to_job(r), r[-1]) for r in rows]
