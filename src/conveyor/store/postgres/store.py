"""The PostgreSQL store: production, many workers on many machines.

psycopg 3 with a connection pool. Claims lock rows with ``FOR UPDATE SKIP
LOCKED`` so concurrent claimers pass each other; every change to a running job
re-checks its lease token in the WHERE clause of the same statement; events
and notifications are written by the statement that makes the change.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import tuple_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool, PoolTimeout

from conveyor.errors import (
    ConfigurationError,
    SchemaMissingError,
    StoreUnavailableError,
)
from conveyor.job import HOLD_AT, Event, Job, JobState, NewJob
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
from conveyor.store.counting import assemble_stats
from conveyor.store.flows import first_states
from conveyor.store.keys import key_pairs, new_job_record, plan_insert, resolve_plan
from conveyor.store.limiting import LIMIT_SLACK_SECONDS, limit_status, limits_of_row
from conveyor.store.postgres import flows as pg_flows
from conveyor.store.postgres.choices import check_choices
from conveyor.store.postgres.listener import Listener
from conveyor.store.selection import (
    NO_ID_BOUND,
    count_query,
    driven,
    keep_state,
    newest_first,
    select_queries,
)
from conveyor.store.sql import Migration, load_migrations, load_queries

log = logging.getLogger("conveyor.postgres")

_Q = load_queries("conveyor.store.postgres")
#: Retention per final state, holding jobs back, outcome readers.
_S = load_queries("conveyor.store.postgres", "seeds.sql")
_MIGRATIONS = load_migrations("conveyor.store.postgres")
_E = load_queries("conveyor.store.postgres", "steps.sql")
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

Connection = psycopg.Connection[tuple[Any, ...]]
Cursor = psycopg.Cursor[tuple[Any, ...]]


def _row_to_job(row: Sequence[Any]) -> Job:
    # ``SELECT *`` gives the columns in table order, the same order as SQLite's.
    (
        id_, queue, task, state, args, kwargs, priority, run_at, attempts, max_attempts, key,
        group, batch, worker, token, lease_expires_at, cancel_requested, result, error, progress,
        progress_message, created_at, started_at, finished_at, limit_key, headers,
    ) = row[:26]  # fmt: skip
    return Job(
        id_, queue, task, JobState(state), args, kwargs, priority, run_at, attempts,
        max_attempts, created_at, key, group, batch, worker, token, lease_expires_at,
        cancel_requested, result, error, progress, progress_message, started_at, finished_at,
        limit_key, headers,
    )  # fmt: skip


def _row_to_event(row: Sequence[Any]) -> Event:
    return Event(*row[:9])


def _row_to_step(row: Sequence[Any]) -> Step:
    return Step(*row[:5])


def _where(dsn: str) -> str:
    """host:port/dbname of a DSN, for messages (never the password); a DSN libpq would
    refuse, refused at once."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"malformed PostgreSQL DSN: {exc}") from None
    check_choices(info)
    host = info.get("host") or urlsplit(dsn).hostname or "localhost"
    return f"{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def session_options(dsn: str) -> str:
    """Server settings for pooled connections, after any ``options`` the DSN gives.

    - timezone=UTC: timestamps come back in UTC.
    - plan_cache_mode=force_generic_plan: the claim's plan does not depend on its
      parameters, and planning it each time cost as much as running it.
    - jit=off: a generic plan's cost estimate (unknown LIMIT) is far above
      jit_above_cost once the table has statistics, and JIT-compiling the claim
      then took about 25 ms on every execution, for statements that run in
      well under a millisecond.
    """
    given = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    ours = "-c timezone=UTC -c plan_cache_mode=force_generic_plan -c jit=off"
    return f"{given} {ours}".strip()


def _configure(conn: Connection | psycopg.Cursor[tuple[Any, ...]]) -> None:
    # Job payloads stay JSON text until a caller reads them (Job decodes lazily).
    conn.adapters.register_loader("jsonb", TextLoader)
    conn.adapters.register_loader("json", TextLoader)


def _own_cursor(conn: psycopg.Connection[Any]) -> Cursor:
    """A cursor on a caller's connection that reads the way pooled connections do.

    The caller's connection may have its own row factory (e.g. dict_row) and
    parse json; this cursor returns tuples and leaves json as text.
    """
    cur = conn.cursor(row_factory=tuple_row)
    cur.adapters.register_loader("jsonb", TextLoader)
    cur.adapters.register_loader("json", TextLoader)
    return cur


def _missing_table(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.UndefinedTable)


def _away(exc: BaseException) -> str | None:
    """Why the server cannot take this call for now, when the error says so; None otherwise.

    SQLSTATE class 53, insufficient resources (53100 disk full, 53200 out of
    memory, 53300 too many connections): the server is short of room, not
    refusing the data; the same call succeeds once there is room again.
    """
    if not isinstance(exc, psycopg.Error) or not (exc.sqlstate or "").startswith("53"):
        return None
    text = str(exc).strip()
    reason = text.splitlines()[0] if text else type(exc).__name__
    return f"is short of resources (SQLSTATE {exc.sqlstate}: {reason})"


@translate_errors(_missing_table, _away)
class PostgresStore:
    #: TransactionalStore: enqueue inside the caller's transaction on this connection.
    transaction_connection = "a psycopg Connection"
    #: SqlStore: the Spark data source builds its tables beside the jobs'.
    sql_dialect = "postgresql"

    def __init__(
        self,
        dsn: str,
        *,
        migrate: bool = False,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 10.0,
        prepare_threshold: int | None = 5,
    ) -> None:
        # prepare_threshold: psycopg prepares a statement on a connection after
        # that many runs; None never prepares, for a pooler in transaction mode
        # that cannot keep prepared statements (PgBouncer before 1.21).
        self.dsn = dsn
        self.where = _where(dsn)
        self.description = f"PostgreSQL at {self.where}"
        self._connect_timeout = connect_timeout
        #: Whether some of these queues have limits, and when this store learnt it
        #: (see _has_limits): they then go to the *_limited statements.
        self._limited: dict[tuple[str, ...], tuple[bool, float]] = {}
        #: The next_run_in answer of the last claim of each set of queues that took
        #: fewer jobs than it could: (seconds, limits seen, when), taken once.
        self._next_due: dict[tuple[str, ...], tuple[float | None, bool, float]] = {}
        self._pool: ConnectionPool[Connection] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={
                # Each statement commits on its own: every change is one statement
                # (events and notifications included), and leaving out BEGIN and
                # COMMIT saves two of three round trips on the claim and ack paths.
                # The few multi-statement methods open a transaction (_tx).
                "autocommit": True,
                "options": session_options(dsn),
                "connect_timeout": max(1, int(connect_timeout)),
                "prepare_threshold": prepare_threshold,
            },
            configure=_configure,
            open=False,
            name="conveyor",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout as exc:
            self._pool.close()
            raise self._unavailable(exc) from None
        if migrate:
            self.migrate()

    def _unavailable(self, exc: BaseException) -> StoreUnavailableError:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as probe:
                probe.execute("SELECT 1")
        except psycopg.Error as direct:
            reason = str(direct).strip().splitlines()[-1] or reason
        return StoreUnavailableError(
            f"cannot connect to PostgreSQL at {self.where}: {reason}. "
            "Is the server running, and is the DSN right?"
        )

    @contextmanager
    def _conn(self, connection: Any = None) -> Iterator[Connection]:
        """A pooled connection in autocommit mode, or the caller's own as it is (not committed)."""
        if connection is not None:
            if not isinstance(connection, psycopg.Connection):
                raise ConfigurationError(
                    f"connection must be a psycopg Connection, got {type(connection).__name__}"
                )
            yield connection
            return
        try:
            with self._pool.connection(timeout=self._connect_timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise self._unavailable(exc) from None
        except psycopg.OperationalError as exc:
            # The server went away mid-call (a restart, a failover, a dropped
            # connection) or is short of room (a full disk): the database is
            # unavailable, not refusing the data. The pool replaces a broken
            # connection; callers that retry, retry.
            short = _away(exc)
            if short is not None:
                raise StoreUnavailableError(f"{self.description} {short}") from exc
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StoreUnavailableError(f"lost PostgreSQL at {self.where}: {reason}") from exc

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One transaction on a pooled connection, for methods of several statements."""
        with self._conn() as conn, conn.transaction():
            yield conn

    def close(self) -> None:
        self._pool.close()

    def ping(self) -> None:
        try:
            with self._conn() as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None

    # --- migrations -------------------------------------------------------------

    def schema_version(self) -> int:
        # Reads only: creating the table here could race a concurrent migrate().
        with self._conn() as conn:
            exists = conn.execute(_Q["migrations_exist"]).fetchone()
            if not exists or not exists[0]:
                return 0
            row = conn.execute(_Q["schema_version"]).fetchone()
            return int(row[0]) if row else 0

    def migrate(self) -> int:
        with self._tx() as conn:
            conn.execute(_Q["migrations_lock"])
            conn.execute(_Q["migrations_table"])
            return self._apply_migrations(
                conn, _MIGRATIONS, _Q["schema_version"], _Q["migration_record"]
            )

    @staticmethod
    def _apply_migrations(
        conn: Connection, migrations: Sequence[Migration], version: str, record: str
    ) -> int:
        """Apply the migrations above the version ``version`` reads, recording each with ``record``.

        Called in a transaction that holds the line's advisory lock. Also how a
        layer above the store runs a migration line of its own tables.
        """
        row = conn.execute(version).fetchone()
        current: int = row[0] if row else 0
        for migration in migrations:
            if migration.version <= current:
                continue
            conn.execute(migration.sql.encode())  # several statements, no parameters
            conn.execute(
                record,
                {"version": migration.version, "name": migration.name, "now": datetime.now(UTC)},
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
        if connection is None and any(new.waits for new in jobs):
            # Jobs that wait are linked to their parents in the insert's transaction.
            with self._tx() as own:
                return self.job_insert_many(jobs, now, connection=own)
        with self._conn(connection) as own:
            conn: Connection | Cursor = own if connection is None else _own_cursor(own)
            pairs = key_pairs(jobs)
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

    # --- reading ------------------------------------------------------------

    def _fetch_jobs(self, name: str, params: dict[str, Any]) -> list[Job]:
        with self._conn() as conn:
            return [_row_to_job(r) for r in conn.execute(_Q[name], params).fetchall()]

    def job_get(self, job_id: int) -> Job | None:
        jobs = self._fetch_jobs("job_get", {"id": job_id})
        return jobs[0] if jobs else None

    def job_get_many(self, job_ids: Sequence[int]) -> list[Job]:
        by_id = {j.id: j for j in self._fetch_jobs("job_get_many", {"ids": list(job_ids)})}
        return [by_id[i] for i in job_ids if i in by_id]

    def event_list(self, job_id: int) -> list[Event]:
        with self._conn() as conn:
            return [_row_to_event(r) for r in conn.execute(_Q["event_list"], {"job_id": job_id})]

    def event_since(self, seq: int, limit: int) -> list[Event]:
        with self._conn() as conn:
            rows = conn.execute(_Q["event_since"], {"seq": seq, "limit": limit})
            return [_row_to_event(r) for r in rows]

    def stats(self, now: datetime) -> Stats:
        self._fold_finished_counts()
        with self._tx() as conn:
            # One transaction at REPEATABLE READ: every figure describes one moment.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # Planned for the values: a generic plan of the events after the
            # offset, or of the last minute's finishes, reads the whole table.
            conn.execute(_Q["plan_for_values"])
            folded = conn.execute(_Q["stats_folded"]).fetchone()
            if folded is None:
                raise SchemaMissingError(
                    f"{self.description}: table finished_counts_folded has lost its one row "
                    "(emptied by hand?); restore a backup, or run migration 011's fill again"
                )
            offset = {"xid": folded[0], "seq": folded[1]}
            counts = conn.execute(_Q["stats_counts"], offset).fetchall()
            counts += [(q, "waiting", n) for q, n in pg_flows.waiting_counts(conn)]
            queued = conn.execute(_Q["stats_queued"], {"now": now}).fetchall()
            retrying = dict(conn.execute(_Q["stats_retrying"], {"now": now}).fetchall())
            since = now - timedelta(minutes=1)
            row = conn.execute(_Q["stats_finished_since"], {"since": since}).fetchone()
            finished = row[0] if row else 0
            paused = {name for name, p in conn.execute(_Q["queue_list"]) if p}
            limits = self._limit_usage(conn, now)
        return assemble_stats(
            counts,
            queued,
            retrying,
            paused,
            lambda oldest: (now - oldest).total_seconds(),
            finished,
            limits,
        )

    def _fold_finished_counts(self) -> None:
        """Add the finishes recorded since the last fold to finished_counts.

        Stats read the table plus the events after its offset, and are exact
        either way: folding keeps that tail short. Skipped while another fold
        or a delete holds the offset (the next stats call folds), and on a
        read-only server (a hot standby: stats there read without folding).
        """
        try:
            with self._tx() as conn:
                offset = conn.execute(_Q["finished_counts_lock_fold"]).fetchone()
                if offset is None:
                    return
                conn.execute(_Q["plan_for_values"])  # the events after this offset only
                conn.execute(_Q["finished_counts_fold"], {"xid": offset[0], "seq": offset[1]})
                conn.execute(_Q["finished_counts_prune"])
        except pg_errors.ReadOnlySqlTransaction:
            return

    def _delete(self, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a statement that deletes jobs, with the lock its count changes need."""
        with self._tx() as conn:
            conn.execute(_Q["finished_counts_lock"])
            return [r[0] for r in conn.execute(_Q[name], params)]

    def batch_status(self, batch: str) -> BatchStatus:
        with self._conn() as conn:
            rows = conn.execute(_Q["batch_counts"], {"batch": batch}).fetchall()
        return BatchStatus(batch, {state: count for state, count in sorted(rows)})

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
        names = tuple(dict.fromkeys(queues))  # a queue named twice is searched once
        params = {
            "queues": list(names),
            "limit": limit,
            "worker": worker,
            "token": secrets.token_hex(16),
            "lease": lease,
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

    def _change(self, name: str, params: dict[str, Any]) -> list[int]:
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_Q[name], params).fetchall()]

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

    # --- operating ------------------------------------------------------------

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        params = {"queue": queue, "before": failed_before, "now": now, "limit": limit}
        for _ in range(3):
            try:
                with self._conn() as conn:
                    return [r[0] for r in conn.execute(_Q["job_retry_failed"], params)]
            except pg_errors.UniqueViolation:
                # A producer enqueued a job with the key of one being retried, after
                # the statement's snapshot: the key's live job is theirs. The next
                # try sees it and leaves that job failed.
                continue
        return []

    def job_delete_terminal(self, job_ids: Sequence[int], finished_before: datetime) -> list[int]:
        if not job_ids:
            return []
        params = {"ids": list(job_ids), "before": finished_before}
        return self._delete("job_delete_terminal", params)

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._change("queue_set_paused", {"name": queue, "paused": True, "now": now})

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._change("queue_set_paused", {"name": queue, "paused": False, "now": now})

    def queue_paused(self) -> set[str]:
        with self._conn() as conn:
            return {name for name, paused in conn.execute(_Q["queue_list"]) if paused}

    # --- workers and maintenance ------------------------------------------------

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

    def _change_none(self, name: str, params: dict[str, Any]) -> int:
        with self._conn() as conn:
            return conn.execute(_Q[name], params).rowcount

    def worker_beat(self, worker_id: str, jobs_in_hand: int, now: datetime) -> None:
        self._change_none(
            "worker_beat", {"id": worker_id, "jobs_in_hand": jobs_in_hand, "now": now}
        )

    def worker_unregister(self, worker_id: str) -> None:
        self._change_none("worker_unregister", {"id": worker_id})

    def worker_list(self) -> list[WorkerInfo]:
        with self._conn() as conn:
            rows = conn.execute(_Q["worker_list"]).fetchall()
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=r[2],
                queues=json.loads(r[3]),
                concurrency=r[4],
                jobs_in_hand=r[5],
                started_at=r[6],
                last_seen_at=r[7],
            )
            for r in rows
        ]

    def worker_prune(self, last_seen_before: datetime) -> int:
        return self._change_none("worker_prune", {"before": last_seen_before})

    def leader_acquire(self, name: str, holder: str, ttl: timedelta, now: datetime) -> bool:
        params = {"name": name, "holder": holder, "expires_at": now + ttl, "now": now}
        return bool(self._change("leader_acquire", params))

    def leader_release(self, name: str, holder: str) -> None:
        self._change_none("leader_release", {"name": name, "holder": holder})

    # --- the dashboard and metrics ------------------------------------------------

    def stats_finished_per_slot(self, since: datetime, slot: timedelta) -> list[FinishedCount]:
        params = {"since": since, "slot": slot.total_seconds()}
        with self._conn() as conn:
            rows = conn.execute(_Q["stats_finished_per_slot"], params).fetchall()
        return [FinishedCount(queue=q, state=s, slot=i, count=c) for q, s, i, c in rows]

    def event_count_by_kind(self, after: EventOffset) -> EventCounts:
        params = {"xid": after[0], "seq": after[1]}
        with self._tx() as conn:
            # Planned for the offset: generically, the events after "some offset"
            # are a third of the table, and the plan read all of them.
            conn.execute(_Q["plan_for_values"])
            rows = conn.execute(_Q["event_count_by_kind"], params).fetchall()
        counts: dict[tuple[str, str], int] = {}
        last = after
        for queue, kind, count, (xid, seq) in rows:
            counts[(queue, kind)] = count
            last = max(last, (int(xid), int(seq)))
        return EventCounts(counts=counts, offset=last)

    def queue_names(self) -> list[str]:
        with self._conn() as conn:
            return [row[0] for row in conn.execute(_Q["queue_names"]).fetchall()]

    def event_offset(self) -> EventOffset:
        with self._conn() as conn:
            row = conn.execute(_Q["event_offset"]).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def job_run_time_histogram(
        self, finished_after: datetime, finished_until: datetime, bounds: Sequence[float]
    ) -> list[RunTimeBucket]:
        params = {"after": finished_after, "until": finished_until, "bounds": list(bounds)}
        with self._conn() as conn:
            rows = conn.execute(_Q["job_run_time_histogram"], params).fetchall()
        return [
            RunTimeBucket(queue=q, bucket=b, count=c, total_seconds=float(s)) for q, b, c, s in rows
        ]

    # --- operating in bulk, groups, retention and the operator's views ------------

    def schema_latest(self) -> int:
        return _MIGRATIONS[-1].version

    def job_select(
        self,
        selection: JobSelection,
        now: datetime,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Job]:
        with self._tx() as conn:
            conn.execute(_Q["plan_for_values"])

            def queue_names() -> list[str]:
                return [row[0] for row in conn.execute(_Q["queue_names"]).fetchall()]

            def newest_id() -> int:
                row = conn.execute(_Q["job_newest_id"]).fetchone()
                return int(row[0]) if row else 0

            pages = [
                [
                    _row_to_job(r)
                    for r in conn.execute(driven(_Q, "job_select", driver), {**params, "now": now})
                ]
                for driver, params in select_queries(
                    selection, before_id, limit, queue_names, newest_id
                )
            ]
        return newest_first(pages, limit)

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        with self._tx() as conn:

            def newest_id() -> int:
                row = conn.execute(_Q["job_newest_id"]).fetchone()
                return int(row[0]) if row else 0

            driver, params = count_query(selection, newest_id)
            conn.execute(_Q["plan_for_values"])
            statement = driven(_Q, "job_count", driver)
            rows = conn.execute(statement, {**params, "now": now}).fetchall()
        return keep_state({state: int(n) for state, n in rows}, selection.state)

    def _change_ids(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        return sorted(self._change(name, {"ids": list(job_ids), "now": now}))

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        for _ in range(3):
            try:
                return self._change_ids("job_retry_many", job_ids, now)
            except pg_errors.UniqueViolation:
                # A producer took the key of a job being retried, after this
                # statement's snapshot (see job_retry_failed): look again.
                continue
        return []

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        with self._tx() as conn:
            params = {"ids": list(job_ids), "now": now}
            ids = [r[0] for r in conn.execute(_Q["job_cancel_many"], params).fetchall()]
            # Waiting jobs, and the jobs waiting for the jobs cancelled now.
            ids += pg_flows.cancel_waiting(conn, job_ids, now)
            pg_flows.release(conn, ids, now)
        return sorted(ids)

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        if not job_ids:
            return []
        with self._tx() as conn:
            conn.execute(_Q["finished_counts_lock"])  # first, as every delete takes it
            pg_flows.orphan(conn, job_ids, None)  # the jobs waiting for them go on
            deleted = [r[0] for r in conn.execute(_Q["job_delete_many"], {"ids": list(job_ids)})]
        return sorted(deleted)

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._change_ids("job_run_now", job_ids, now)

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        with self._conn() as conn:
            held = conn.execute(_Q["job_running_leases"], {"ids": list(job_ids)}).fetchall()
        finishes = [Finish(i, token, "take_back", error=TAKEN_BACK_ERROR) for i, token in held]
        return self.job_finish(finishes, now)

    def job_purge_where(
        self,
        finished_before: datetime,
        states: Sequence[str],
        queue: str | None,
        limit: int = 10_000,
    ) -> int:
        params = {"before": finished_before, "states": list(states), "queue": queue}
        (count,) = self._delete("job_purge_where", {**params, "limit": limit})
        return int(count)

    def job_purge_count(
        self, finished_before: datetime, states: Sequence[str], queue: str | None
    ) -> int:
        params = {"before": finished_before, "states": list(states), "queue": queue}
        with self._conn() as conn:
            row = conn.execute(_Q["job_purge_count"], params).fetchone()
        return int(row[0]) if row else 0

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        params = {"queue": queue, "keep": keep, "limit": limit, "states": list(states)}
        (count,) = self._delete("job_purge_beyond", params)
        return int(count)

    def job_hold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_hold", job_ids, now)

    def job_unhold(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._hold("job_unhold", job_ids, now)

    def _hold(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        params = {"ids": list(job_ids), "now": now, "hold_at": HOLD_AT}
        with self._conn() as conn:
            return sorted(r[0] for r in conn.execute(_S[name], params).fetchall())

    def job_held(self, queue: str | None, before_id: int | None, limit: int) -> list[int]:
        params = {
            "queue": queue, "hold_at": HOLD_AT, "limit": limit,
            "before_id": before_id if before_id is not None else NO_ID_BOUND,
        }  # fmt: skip
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_S["job_held"], params)]

    def job_unprocessed(
        self, queue: str | None, states: Sequence[str], since: datetime, limit: int
    ) -> list[int]:
        params = {"queue": queue, "states": list(states), "since": since, "limit": limit}
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_S["job_unprocessed"], params)]

    def job_mark_processed(self, job_id: int) -> bool:
        with self._conn() as conn:
            return conn.execute(_S["job_mark_processed"], {"id": job_id}).rowcount == 1

    def queue_delete(self, queue: str) -> None:
        self._change_none("queue_delete", {"name": queue})

    # --- workflows: jobs that wait for other jobs -----------------------------------

    def job_parents(self, job_id: int) -> list[Relative]:
        with self._conn() as conn:
            rows = pg_flows.relatives(conn, job_id, children=False)
        return _relatives(rows)

    def job_children(self, job_id: int) -> list[Relative]:
        with self._conn() as conn:
            rows = pg_flows.relatives(conn, job_id, children=True)
        return _relatives(rows)

    def job_workflow(self, job_id: int) -> str | None:
        with self._conn() as conn:
            row = conn.execute(pg_flows.Q["job_workflow"], {"id": job_id}).fetchone()
        return None if row is None else row[0]

    def workflow_insert(
        self, workflow_id: str, name: str, jobs: Sequence[NewJob], now: datetime
    ) -> tuple[list[Job], bool]:
        with self._tx() as conn:
            params = {"id": workflow_id, "name": name, "jobs": len(jobs), "now": now}
            if conn.execute(pg_flows.Q["workflow_create"], params).fetchone() is None:
                return self._workflow_jobs(conn, workflow_id), True
            return self.job_insert_many(jobs, now, conn, workflow=workflow_id), False

    def _workflow_jobs(self, conn: Connection, workflow_id: str) -> list[Job]:
        rows = conn.execute(pg_flows.Q["workflow_jobs"], {"id": workflow_id}).fetchall()
        return [_row_to_job(r) for r in rows]

    def workflow_get(self, workflow_id: str) -> WorkflowInfo | None:
        with self._conn() as conn:
            row = conn.execute(pg_flows.Q["workflow_get"], {"id": workflow_id}).fetchone()
        return None if row is None else WorkflowInfo(*row)

    def workflow_list(self, limit: int = 100) -> list[WorkflowInfo]:
        with self._conn() as conn:
            rows = conn.execute(pg_flows.Q["workflow_list"], {"limit": limit}).fetchall()
        return [WorkflowInfo(*r) for r in rows]

    def workflow_jobs(self, workflow_id: str) -> list[Job]:
        with self._conn() as conn:
            return self._workflow_jobs(conn, workflow_id)

    def workflow_counts(self, workflow_id: str) -> dict[str, int]:
        with self._conn() as conn:
            rows = conn.execute(pg_flows.Q["workflow_counts"], {"id": workflow_id}).fetchall()
        return {state: count for state, count in sorted(rows)}

    def workflow_edges(self, workflow_id: str) -> list[tuple[int, int, str | None]]:
        with self._conn() as conn:
            rows = conn.execute(pg_flows.Q["workflow_edges"], {"id": workflow_id}).fetchall()
        return [(child, parent, resolved) for child, parent, resolved in rows]

    # --- flow control: rate and concurrency limits --------------------------------

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

    def _saw_limits(self, names: tuple[str, ...], limited: bool) -> None:
        self._limited[names] = (limited, time.monotonic())

    def _limits_changed(self, queue: str) -> None:
        """This store set a limit or throttle on ``queue``: its next claim obeys it."""
        for names in list(self._limited):
            if queue in names:
                self._saw_limits(names, True)

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
            "now": now,
        }
        with self._tx() as conn:
            conn.execute(_Q["limit_set"], params)
            conn.execute(_Q["limit_forget_empty"], params)
            row = conn.execute(_Q["limit_get"], params).fetchone()
        self._limits_changed(queue)
        return None if row is None else limits_of_row(row, _same)

    def limit_get(self, queue: str) -> QueueLimits | None:
        with self._conn() as conn:
            row = conn.execute(_Q["limit_get"], {"queue": queue}).fetchone()
        return None if row is None else limits_of_row(row, _same)

    def limit_throttle(
        self, queue: str, limit_key: str | None, seconds: float, now: datetime | None = None
    ) -> datetime:
        params = {"queue": queue, "key": limit_key, "seconds": seconds, "now": now}
        if seconds <= 0:
            name = "limit_lift_queue" if limit_key is None else "limit_lift_key"
            with self._tx() as conn:
                row = conn.execute(_Q[name], params).fetchone()
                conn.execute(_Q["limit_forget_empty"], params)
        else:
            name = "limit_throttle_queue" if limit_key is None else "limit_throttle_key"
            with self._conn() as conn:
                row = conn.execute(_Q[name], params).fetchone()
            self._limits_changed(queue)
        assert row is not None
        until: datetime = row[0]
        return until

    def _limit_usage(self, conn: Connection, now: datetime) -> list[LimitStatus]:
        rows = conn.execute(_Q["limit_usage"], {"now": now}).fetchall()
        return [limit_status(limits_of_row(row[:8], _same), now, *row[8:]) for row in rows]

    def limit_status(self, now: datetime) -> list[LimitStatus]:
        with self._tx() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return self._limit_usage(conn, now)

    def limit_prune(self, now: datetime) -> None:
        params = {"now": now, "slack": LIMIT_SLACK_SECONDS}
        with self._tx() as conn:
            conn.execute(_Q["limit_prune_all_starts"], params)
            conn.execute(_Q["limit_prune_throttles"], params)
            conn.execute(_Q["limit_prune_rows"], params)

    # --- exactly-once effects (docs/effects.md) -----------------------------------

    def job_complete_in(
        self, lease: Lease, result_json: str, connection: Any, now: datetime | None = None
    ) -> bool:
        if not isinstance(connection, psycopg.Connection):
            raise ConfigurationError(
                "ctx.complete needs a psycopg Connection to the queue's database, "
                f"got {type(connection).__name__}"
            )
        status = connection.info.transaction_status
        # In a transaction block, or one that this statement opens (not autocommit).
        open_one = status == psycopg.pq.TransactionStatus.INTRANS or (
            status == psycopg.pq.TransactionStatus.IDLE and not connection.autocommit
        )
        if not open_one:
            raise ConfigurationError(
                "ctx.complete needs an open transaction on the connection (not autocommit, "
                "not failed): call it inside `with conn.transaction():` or before conn.commit()"
            )
        # The worker's own finish of a success, in the caller's transaction (which,
        # unlike job_finish, waits for a row held a moment by a renewal or a rescue).
        params = _finish_params(
            [Finish.complete(lease.id, lease.token, result_json)], now, flows=True
        )
        with _own_cursor(connection) as cur:
            row = cur.execute(_Q["job_complete_in"], params).fetchone()
            if row is None or not row[1]:  # not ended (a row passed over: a lease lost meanwhile)
                return False
            # The jobs waiting for this one go on in the same transaction.
            pg_flows.release(cur, [lease.id], now)
            return True

    def step_list(self, job_id: int) -> list[Step]:
        with self._conn() as conn:
            rows = conn.execute(_E["step_list"], {"job_id": job_id}).fetchall()
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
            "started_at": started_at,
            "now": now,
        }
        with self._conn() as conn:
            row = conn.execute(_E["step_record"], params).fetchone()
            if row is None:
                # Recorded already (kept), or the lease is gone (None).
                row = conn.execute(_E["step_get"], {"job_id": lease.id, "name": name}).fetchone()
        return None if row is None else _row_to_step(row)

    def session(self) -> Any:
        """Public access to this store's connections, for a layer built on top of it.

        A ``PostgresSession`` (typed as ``Any`` here so that this file need not import it).
        """
        from conveyor.store.postgres.session import PostgresSession

        return PostgresSession(self)


def _finish_params(
    finishes: Sequence[Finish], now: datetime | None, flows: bool = False
) -> dict[str, Any]:
    """job_finish's parameters: one array per field of the outcomes; ``flows`` when
    the caller's transaction resolves the edges onto the jobs it ends."""
    return {
        "flows": flows,
        "ids": [f.id for f in finishes],
        "tokens": [f.token for f in finishes],
        "kinds": [f.kind for f in finishes],
        "results": [f.result_json for f in finishes],
        "errors": [f.error for f in finishes],
        "run_ats": [f.run_at for f in finishes],
        "now": now,
    }


def _same(value: datetime | None) -> datetime | None:
    """Timestamps come back from psycopg as aware datetimes already."""
    return value


def _relatives(rows: list[Any]) -> list[Relative]:
    """Relatives from rows of a job's columns, then the relative's id and the edge's
    resolution; a parent deleted since has NULL columns (no job)."""
    return [Relative(r[-2], None if r[0] is None else _row_to_job(r), r[-1]) for r in rows]
