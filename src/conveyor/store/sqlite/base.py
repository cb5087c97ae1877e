"""The SQLite store's plumbing: a connection per thread, the one writer, migrations, rows.

Every capability mixin of ``SQLiteStore`` builds on ``SQLiteBase``; Spark's
storage uses its private members (``_conn``, ``_write``, ``_apply_migrations``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from conveyor.errors import ConfigurationError, SchemaMissingError, StoreUnavailableError
from conveyor.job import Event, Job, JobState
from conveyor.store.columns import EVENT_COLUMNS, JOB_COLUMNS
from conveyor.store.event_kinds import EVENT_KINDS
from conveyor.store.limiting import limit_status, limits_of_row
from conveyor.store.records import Finish, LimitStatus
from conveyor.store.sql import Migration, load_migrations, load_queries
from conveyor.store.sqlite import flows as sqlite_flows

_Q = load_queries("conveyor.store.sqlite")

#: Retention per final state, holding jobs back, outcome readers.
_S = load_queries("conveyor.store.sqlite", "seeds.sql")
_MIGRATIONS = load_migrations("conveyor.store.sqlite")

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
#: SQLite's busy handler sleeps up to 100 ms between tries of the write lock. A
#: rescue writes only RESCUE_QUIET after the end of any long hold of the lock it
#: may have followed (the lock is tried every RESCUE_PROBE): a renewal that was
#: waiting for that hold (and whose lease ran out meanwhile) has got the lock
#: first by then, so its lease is not rescued. A hold is long when the lock was
#: refused for RESCUE_LONG_HOLD (a lease of 0.75 s runs out only after a hold of
#: 0.5 s), or refused from the first try on; the lock of a busy database, taken
#: and let go by many short writes, does not keep a rescue out.
RESCUE_QUIET = 0.25
RESCUE_PROBE = 0.05
RESCUE_LONG_HOLD = 0.3


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


class SQLiteBase:
    """The file, its connections and write lock, and the helpers every capability uses."""

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
    def _quiet_write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction begun RESCUE_QUIET after any long hold of the lock ended.

        The lock is tried every RESCUE_PROBE without SQLite's busy handler and let go
        at once until then: every writer that waited for such a hold, in this
        process or another, has had its turn. What came before the first try is
        unknown, so the count starts with it too.
        """
        conn = self._conn()
        first = time.monotonic()
        deadline = first + self.busy_timeout
        writes_from = first + RESCUE_QUIET
        refused_since: float | None = None
        while True:
            began = False
            if self._writer.acquire(blocking=False):
                try:
                    conn.execute("PRAGMA busy_timeout = 0")
                    try:
                        conn.execute("BEGIN IMMEDIATE")
                        began = True
                    finally:
                        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        self._writer.release()
                        raise
                if not began:
                    self._writer.release()
            now = time.monotonic()
            if not began:
                refused_since = refused_since or now
                if now > deadline:
                    raise StoreUnavailableError(
                        f"{self.description} is locked: another process held the write "
                        f"lock for over {self.busy_timeout:g}s"
                    )
            else:
                if refused_since is not None and (
                    refused_since == first or now - refused_since >= RESCUE_LONG_HOLD
                ):
                    writes_from = max(writes_from, now + RESCUE_QUIET)
                refused_since = None
                if now >= writes_from:
                    break
                conn.execute("ROLLBACK")
                self._writer.release()
            time.sleep(RESCUE_PROBE)
        try:
            with committed(conn):
                yield conn
        finally:
            self._writer.release()

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

    def _queue_names(self) -> list[str]:
        """Every queue with jobs or settings (InsightStore's, and a listing's drivers)."""
        return [row[0] for row in self._conn().execute(_Q["queue_names"])]

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

    def _delete_jobs(self, conn: sqlite3.Connection, ids: list[int]) -> None:
        """Delete jobs and their events, their counts with them (in the caller's transaction)."""
        if not ids:
            return
        encoded = json.dumps(ids)
        sqlite_flows.forget(conn, encoded)
        conn.execute(_Q["finished_counts_forget"], {"ids": encoded})
        conn.execute(_Q["event_delete_for_jobs"], {"ids": encoded})
        conn.execute(_Q["job_delete"], {"ids": encoded})

    def _record(self, conn: sqlite3.Connection, action: str, ids: list[int], now_ts: float) -> None:
        """Append the events of ``action`` for the jobs it just changed (same transaction)."""
        if not ids:
            return
        params = {"ids": json.dumps(ids), "kinds": json.dumps(EVENT_KINDS[action]), "now": now_ts}
        conn.execute(_Q["event_insert_for_jobs"], params)

    def schema_latest(self) -> int:
        return _MIGRATIONS[-1].version

    def _limit_usage(self, conn: sqlite3.Connection, now: datetime) -> list[LimitStatus]:
        rows = conn.execute(_Q["limit_usage"], {"now": _ts(now)}).fetchall()
        return [limit_status(limits_of_row(row[:8], _dt), now, *row[8:]) for row in rows]


@contextmanager
def immediate_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A transaction under SQLite's write lock: what it reads stays true until it commits."""
    conn.execute("BEGIN IMMEDIATE")
    with committed(conn):
        yield conn


@contextmanager
def committed(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The end of a transaction begun on ``conn``: committed, or rolled back on any error."""
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
