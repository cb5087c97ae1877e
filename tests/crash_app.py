"""The App that the worker processes of test_crash.py run: ``conveyor worker crash_app:app``.

``crash_app:app`` is built on first access from ``CONVEYOR_DSN``, so the test
process can import this module (for ``build`` and the table helpers) without
that variable. Handlers leave traces in tables of the same database, written
on connections of their own, so the tests can see what ran where and when:

- ``done(job_id, worker_pid)``: one row per run of ``record``;
- ``runs(job_id, name, phase, at)``: ``sleepy`` at its start and end;
- ``group_runs(grp, seq, started, ended, pid)``: one row per run of ``in_group``;
- ``effects(job_id, attempt, pid)``: the effect of ``effect`` and ``frozen_effect``,
  written in the transaction that completes the job (``ctx.complete``; SQL stores).

On Redis, which has no tables, the traces go to a SQLite file named after the
Redis server's port (``trace_dsn``), which every process of the test finds.

Times are ``time.monotonic()``, one clock for every process of the machine.
``CRASH_WORKER_NAME`` names a worker process in what its handlers return.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from conveyor import App, Context, FixedBackoff, Retry
from conveyor.errors import LeaseLostError
from conveyor.store.dsn import sqlite_path
from durable_tasks import register_durable

TABLES = (
    "CREATE TABLE IF NOT EXISTS done (job_id bigint NOT NULL, worker_pid integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS runs ("
    " job_id bigint NOT NULL, name text NOT NULL, phase text NOT NULL,"
    " at double precision NOT NULL)",
    "CREATE TABLE IF NOT EXISTS group_runs ("
    " grp text NOT NULL, seq integer NOT NULL, started double precision NOT NULL,"
    " ended double precision NOT NULL, pid integer NOT NULL)",
    "CREATE TABLE IF NOT EXISTS effects ("
    " job_id bigint NOT NULL, attempt integer NOT NULL, pid integer NOT NULL)",
)
#: How long a handler keeps trying to write its trace while the database is away.
WRITE_DEADLINE = 60.0


def trace_dsn(dsn: str) -> str:
    """Where the traces of a job store's handlers go: the same database, or for Redis a file."""
    if dsn.startswith(("redis:", "rediss:", "unix:")):
        name = f"conveyor-crash-trace-{urlsplit(dsn).port}.db"
        return f"sqlite:///{Path(tempfile.gettempdir()) / name}"
    return dsn


def connect(dsn: str) -> Any:
    """A DB-API connection to the database of ``dsn`` that commits every statement."""
    dsn = trace_dsn(dsn)
    if dsn.startswith("sqlite:"):
        return sqlite3.connect(sqlite_path(dsn), timeout=30, isolation_level=None)
    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a fresh connection (``%s`` placeholders); rows it returns."""
    conn = connect(dsn)
    try:
        return _run(conn, dsn, sql, params)
    finally:
        conn.close()


def create_tables(dsn: str) -> None:
    if trace_dsn(dsn) != dsn:  # a trace file of its own: empty it for this test
        sqlite_path(trace_dsn(dsn)).unlink(missing_ok=True)
    for statement in TABLES:
        query(dsn, statement)


def _run(conn: Any, dsn: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if trace_dsn(dsn).startswith("sqlite:"):
        cur = conn.execute(sql.replace("%s", "?"), params)
        return list(cur.fetchall())
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []


_local = threading.local()


def _write(sql: str, params: tuple[Any, ...]) -> None:
    """Write a trace on this handler thread's own connection, reconnecting as needed."""
    dsn = os.environ["CONVEYOR_DSN"]
    deadline = time.monotonic() + WRITE_DEADLINE
    while True:
        conn = getattr(_local, "conn", None)
        try:
            if conn is None:
                conn = _local.conn = connect(dsn)
            _run(conn, dsn, sql, params)
            return
        except (sqlite3.Error, psycopg.Error):
            _local.conn = None
            if conn is not None:
                conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def sleep_until(deadline: float) -> None:
    """Sleep until a point on the machine's monotonic clock, in short steps.

    One long ``time.sleep`` leaves out the time its process spent stopped
    (SIGSTOP); a process resumed after its deadline returns from this at once.
    """
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.02))


def worker_name() -> str:
    return os.environ.get("CRASH_WORKER_NAME") or str(os.getpid())


def register(app: App) -> App:
    """Register the handlers the tests use on ``app``."""

    # Many attempts: a job may be on a worker that is killed more than once.
    @app.task(max_attempts=20)
    def record(ctx: Context, pause: float) -> int:
        _write("INSERT INTO done (job_id, worker_pid) VALUES (%s, %s)", (ctx.job_id, os.getpid()))
        time.sleep(pause)
        return ctx.job_id

    @app.task(max_attempts=5)
    def sleepy(ctx: Context, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        name = worker_name()
        _write(
            "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, name, "start", time.monotonic()),
        )
        sleep_until(deadline)
        _write(
            "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, name, "end", time.monotonic()),
        )
        return name

    @app.task(max_attempts=5)
    def pause(seconds: float, n: int) -> int:
        time.sleep(seconds)
        return n

    @app.task
    def until_cancelled(ctx: Context, limit: float) -> str:
        ctx.cancelled.wait(limit)
        return "ran to its limit"

    @app.task
    def in_group(group: str, seq: int, seconds: float) -> None:
        started = time.monotonic()
        time.sleep(seconds)
        ended = time.monotonic()
        _write(
            "INSERT INTO group_runs (grp, seq, started, ended, pid) VALUES (%s, %s, %s, %s, %s)",
            (group, seq, started, ended, os.getpid()),
        )

    @app.task(max_attempts=5)
    def stubborn(ctx: Context, seconds: float) -> int:
        """Its first attempt ignores every stop request for ``seconds``; later ones are quick."""
        name = worker_name()
        _write(
            "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, f"{name}:{ctx.attempt}", "start", time.monotonic()),
        )
        if ctx.attempt == 1:
            sleep_until(time.monotonic() + seconds)
        _write(
            "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
            (ctx.job_id, f"{name}:{ctx.attempt}", "end", time.monotonic()),
        )
        return ctx.attempt

    @app.task
    def forks_a_sleeper(path: str) -> int:
        """Forks a child that sleeps forever (its pid in ``path``); returns at once."""
        pid = os.fork()
        if pid == 0:
            while True:
                time.sleep(1)
        Path(path).write_text(str(pid))
        return pid

    @app.task
    def noop() -> None:
        return None

    @app.task(backoff=FixedBackoff(1.0))
    def fails_once(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails on purpose")
        return ctx.attempt

    @app.task
    def snoozes_once(ctx: Context, delay: float) -> str:
        # A snooze gives its attempt back; the first run is the one whose run_at
        # is still its enqueue time.
        if ctx.job.run_at <= ctx.job.created_at:
            raise Retry(delay)
        return "woke"

    return app


def _effect_connection() -> Any:
    """This handler thread's connection to the job's own database, for transactions."""
    conn = getattr(_local, "effect_conn", None)
    if conn is None:
        dsn = os.environ["CONVEYOR_DSN"]
        if dsn.startswith("sqlite:"):
            conn = sqlite3.connect(sqlite_path(dsn), timeout=30, isolation_level=None)
        else:
            conn = psycopg.connect(dsn, connect_timeout=5)
        _local.effect_conn = conn
    return conn


@contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    """A transaction on ``conn``: committed at the end, rolled back on an exception."""
    if isinstance(conn, psycopg.Connection):
        with conn.transaction():
            yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _write_effect(conn: Any, ctx: Context) -> None:
    sql = "INSERT INTO effects (job_id, attempt, pid) VALUES (%s, %s, %s)"
    if not isinstance(conn, psycopg.Connection):
        sql = sql.replace("%s", "?")
    conn.execute(sql, (ctx.job_id, ctx.attempt, os.getpid()))


def register_effects(app: App) -> App:
    """Handlers with exactly-once effects (ctx.complete) and durable steps (ctx.step)."""

    @app.task(max_attempts=20)
    def effect(ctx: Context, pause: float) -> int:
        """One effect row, committed with the job's success (its result: this pid)."""
        time.sleep(pause)
        conn = _effect_connection()
        with _transaction(conn):
            _write_effect(conn, ctx)
            if isinstance(conn, psycopg.Connection):
                # A wide window for a kill between the effect and its commit (on
                # SQLite this would hold every other writer back meanwhile).
                time.sleep(pause)
            ctx.complete(conn, result=os.getpid())
        return -1  # not recorded: the job succeeded in the transaction above

    @app.task(max_attempts=5)
    def frozen_effect(ctx: Context, hold: float, inside: bool = False) -> int:
        """Its first attempt waits ``hold`` seconds (to be frozen): before its transaction,
        or ``inside`` it, between the effect and ``ctx.complete`` (PostgreSQL: on SQLite
        that would hold every other writer back)."""

        def wait_to_be_frozen() -> None:
            if ctx.attempt == 1:
                _write(
                    "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
                    (ctx.job_id, worker_name(), "start", time.monotonic()),
                )
                sleep_until(time.monotonic() + hold)

        if not inside:
            wait_to_be_frozen()
        conn = _effect_connection()
        try:
            with _transaction(conn):
                _write_effect(conn, ctx)
                if inside:
                    wait_to_be_frozen()
                ctx.complete(conn, result=ctx.attempt)
        except LeaseLostError:
            _write(
                "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
                (ctx.job_id, worker_name(), "lease lost", time.monotonic()),
            )
            raise
        return -1

    @app.task(max_attempts=20)
    def stepped(ctx: Context, steps: int, pause: float) -> int:
        """``steps`` durable steps of ``pause`` seconds; each run of one leaves a row in runs."""

        def one(i: int) -> int:
            _write(
                "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
                (ctx.job_id, f"s{i}", str(ctx.attempt), time.monotonic()),
            )
            time.sleep(pause)
            return i * 10

        return sum(int(ctx.step(f"s{i}", one, i)) for i in range(steps))

    return app


def build(dsn: str | None = None, **options: Any) -> App:
    return register_durable(register_effects(register(App(dsn, **options))), _write)


_app: App | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = build(os.environ["CONVEYOR_DSN"])
        return _app
    raise AttributeError(name)
