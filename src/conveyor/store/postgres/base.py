"""The PostgreSQL store's plumbing: the connection pool, transactions, migrations, rows.

Every capability mixin of ``PostgresStore`` builds on ``PostgresBase``; Spark's
storage uses its private members (``_conn``, ``_tx``, ``_apply_migrations``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool, PoolTimeout

from conveyor.errors import ConfigurationError, StoreUnavailableError
from conveyor.job import Event, Job, JobState
from conveyor.store.limiting import limit_status, limits_of_row
from conveyor.store.postgres.choices import check_choices
from conveyor.store.postgres.pool_log import quiet_pool_warnings
from conveyor.store.records import Finish, LimitStatus
from conveyor.store.sql import Migration, load_migrations, load_queries

_Q = load_queries("conveyor.store.postgres")
#: Retention per final state, holding jobs back, outcome readers.
_S = load_queries("conveyor.store.postgres", "seeds.sql")
_MIGRATIONS = load_migrations("conveyor.store.postgres")

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


class PostgresBase:
    """The pool and the helpers every capability's statements run through."""

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
        quiet_pool_warnings()
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
        return StoreUnavailableError.saying(f"cannot connect to PostgreSQL at {self.where}", reason)

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

    def _fetch_jobs(self, name: str, params: dict[str, Any]) -> list[Job]:
        with self._conn() as conn:
            return [_row_to_job(r) for r in conn.execute(_Q[name], params).fetchall()]

    def _delete(self, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a statement that deletes jobs, with the lock its count changes need."""
        with self._tx() as conn:
            conn.execute(_Q["finished_counts_lock"])
            return [r[0] for r in conn.execute(_Q[name], params)]

    def _change(self, name: str, params: dict[str, Any]) -> list[int]:
        with self._conn() as conn:
            return [r[0] for r in conn.execute(_Q[name], params).fetchall()]

    def _change_none(self, name: str, params: dict[str, Any]) -> int:
        with self._conn() as conn:
            return conn.execute(_Q[name], params).rowcount

    def schema_latest(self) -> int:
        return _MIGRATIONS[-1].version

    def _change_ids(self, name: str, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        return sorted(self._change(name, {"ids": list(job_ids), "now": now}))

    def _per_job(self, statement: str, job_ids: Sequence[int]) -> dict[int, Any]:
        """What ``statement`` reads (rows: id, value) for the jobs of ``job_ids`` that
        have a value: a per-job column that ``set_per_job`` wrote; none asked, none read."""
        if not job_ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(statement, {"ids": list(job_ids)}).fetchall()
        return {int(job_id): value for job_id, value in rows}

    def _saw_limits(self, names: tuple[str, ...], limited: bool) -> None:
        self._limited[names] = (limited, time.monotonic())

    def _limit_usage(self, conn: Connection, now: datetime) -> list[LimitStatus]:
        rows = conn.execute(_Q["limit_usage"], {"now": now}).fetchall()
        return [limit_status(limits_of_row(row[:8], _same), now, *row[8:]) for row in rows]


def set_per_job(conn: Any, statement: str, values: dict[int, Any]) -> None:
    """Run a ``job_set_*`` statement (arrays ``ids`` and ``values``) for the jobs of
    ``values`` (id -> value) that have one, in the insert's transaction; nothing is
    run when none has one."""
    pairs = [(i, value) for i, value in values.items() if value is not None]
    if pairs:
        conn.execute(statement, {"ids": [i for i, _ in pairs], "values": [v for _, v in pairs]})


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
