"""A full disk is an outage, on every store: outcomes wait for room, enqueues say so.

Each test fills a real disk or a real server's memory: a small tmpfs mounted
by the test under the SQLite file, the tablespace of a PostgreSQL server or
the append-only file of a redis-server, and a redis-server whose ``maxmemory``
is lowered under what it holds (``noeviction``: writes answer OOM). While it
is full, an outcome that does not fit is kept by the worker and written again
once there is room, never turned into a failure; an enqueue raises
``StoreUnavailableError`` and writes nothing.
"""

from __future__ import annotations

import errno
import logging
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from conveyor import App, Context, JobState
from conveyor.errors import StoreUnavailableError
from outages import STORE_OPTIONS
from pg_server import PgServer
from redis_server import RedisServer
from waiting import wait_until

#: Bytes left free on a filled disk: a few pages of heartbeats and a failure row fit, BIG does not.
LEFT = 192 * 1024
#: A result too big for the room left (random: PostgreSQL would compress a repeated one).
BIG = secrets.token_hex(300_000)
#: An enqueue that cannot fit either.
BIG_ARGS = secrets.token_hex(450_000)


@contextmanager
def tiny_disk(where: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``where``, unmounted afterwards; skips where mount is refused."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(disk: Path, leave: int = LEFT) -> Path:
    """Fill ``disk`` until the kernel says it is full, then give back ``leave`` bytes."""
    filler = disk / "filler"
    chunk = b"\0" * (64 * 1024)
    with filler.open("wb") as out:
        try:
            while True:
                out.write(chunk)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        size = out.tell()
        out.truncate(max(0, size - leave))
    return filler


def outcome_retries(records: list[logging.LogRecord]) -> bool:
    return any("recording" in r.getMessage() and "outcome" in r.getMessage() for r in records)


class Trap(logging.Handler):
    """Keeps the worker's log records, to see that it met the outage (from its own threads)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def trapped() -> Iterator[Trap]:
    trap = Trap()
    logger = logging.getLogger("conveyor")
    logger.addHandler(trap)
    try:
        yield trap
    finally:
        logger.removeHandler(trap)


def run_through_a_full_store(
    app: App, full: Callable[[], object], room: Callable[[], object]
) -> None:
    """A job whose big result meets a full store: it ends succeeded, once, when there is room.

    ``full()`` makes the store full while the handler runs; ``room()`` gives the
    room back. Meanwhile an enqueue raises StoreUnavailableError and adds nothing.
    """
    started = threading.Event()
    filled = threading.Event()

    @app.task(max_attempts=1)
    def big(ctx: Context) -> str:
        started.set()
        assert filled.wait(60), "the test did not fill the store"
        return BIG

    @app.task()
    def other(payload: str) -> None:
        pass

    job = big.enqueue()
    with trapped() as trap, app.worker(concurrency=1, lease=30, poll_interval=0.2):
        assert started.wait(30)
        full()
        try:
            with pytest.raises(StoreUnavailableError) as refused:
                other.enqueue(BIG_ARGS)
            assert app.store.description in str(refused.value)  # type: ignore[attr-defined]
            filled.set()
            wait_until(lambda: outcome_retries(trap.records), 30, "the completer met the outage")
            assert app.get(job.id).state == JobState.RUNNING
        finally:
            filled.set()
            room()
        assert app.wait(job.id, timeout=60) == BIG
    done = app.get(job.id)
    assert done.state == JobState.SUCCEEDED and done.attempts == 1 and done.error is None
    assert app.jobs(task=other.name) == [], "a refused enqueue wrote nothing"


@pytest.mark.slow
def test_sqlite_full_disk_keeps_the_outcome_and_refuses_enqueues(tmp_path: Path) -> None:
    with tiny_disk(tmp_path / "disk") as disk:
        filler: list[Path] = []
        with App(f"sqlite:///{disk / 'q.db'}", **STORE_OPTIONS["sqlite"]) as app:
            app.migrate()
            run_through_a_full_store(
                app, lambda: filler.append(fill(disk)), lambda: filler[0].unlink()
            )


@pytest.mark.slow
def test_postgres_full_tablespace_keeps_the_outcome_and_refuses_enqueues() -> None:
    """Conveyor's tables in a tablespace on a small tmpfs: a full one answers SQLSTATE 53100."""
    # Every parent of a tablespace must be traversable by the server's own user.
    base = Path(tempfile.mkdtemp(prefix="conveyor-disk-"))
    base.chmod(0o755)
    try:
        run_on_a_full_tablespace(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_on_a_full_tablespace(base: Path) -> None:
    with tiny_disk(base / "disk") as disk, PgServer() as pg:
        space = disk / "tablespace"
        space.mkdir()
        shutil.chown(space, "postgres", "postgres")
        with psycopg.connect(pg.dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE TABLESPACE tiny LOCATION {}").format(sql.Literal(str(space)))
            )
            database = admin.execute("SELECT current_database()").fetchone()
            assert database is not None
            admin.execute(
                sql.SQL("ALTER DATABASE {} SET default_tablespace = tiny").format(
                    sql.Identifier(database[0])
                )
            )
        filler: list[Path] = []
        with App(pg.dsn, **STORE_OPTIONS["postgres"]) as app:
            app.migrate()
            with psycopg.connect(pg.dsn) as check:
                placed = check.execute(
                    "SELECT t.spcname FROM pg_class c JOIN pg_tablespace t "
                    "ON t.oid = c.reltablespace WHERE c.relname = 'jobs'"
                ).fetchone()
            assert placed == ("tiny",), "the jobs table is on the small disk"
            run_through_a_full_store(
                app, lambda: filler.append(fill(disk)), lambda: filler[0].unlink()
            )


@pytest.mark.slow
def test_redis_out_of_memory_keeps_the_outcome_and_refuses_enqueues() -> None:
    """A redis-server over its maxmemory with noeviction answers OOM to every write."""
    server = RedisServer(extra=["--maxmemory-policy", "noeviction"])
    server.start()
    admin = redis.Redis.from_url(server.dsn)
    try:
        with App(server.dsn, **STORE_OPTIONS["redis"]) as app:
            app.migrate()
            run_through_a_full_store(
                app,
                lambda: admin.config_set("maxmemory", 1),
                lambda: admin.config_set("maxmemory", 0),
            )
    finally:
        admin.close()
        server.stop()


@pytest.mark.slow
def test_redis_full_disk_keeps_the_outcome_and_refuses_enqueues(tmp_path: Path) -> None:
    """The append-only file on a full tmpfs: redis-server answers MISCONF to every write."""
    with tiny_disk(tmp_path / "disk") as disk:
        server = RedisServer()
        server.dir = disk  # the append-only file (and the server's log) go there
        server.start()
        probe = redis.Redis.from_url(server.dsn)
        filler: list[Path] = []

        def refused() -> bool:
            # Redis applies the write whose append fails, then refuses the next ones.
            try:
                probe.set("probe", secrets.token_hex(8))
            except redis.ResponseError as exc:
                assert "MISCONF" in str(exc), exc
                return True
            return False

        def full() -> None:
            filler.append(fill(disk, leave=0))
            wait_until(refused, 30, "redis-server refuses writes on the full disk")

        try:
            with App(server.dsn, **STORE_OPTIONS["redis"]) as app:
                app.migrate()
                run_through_a_full_store(app, full, lambda: filler[0].unlink())
        finally:
            probe.close()
            server.stop()


@pytest.mark.slow
def test_sqlite_stats_on_a_full_disk_count_without_their_bookkeeping_write(
    tmp_path: Path,
) -> None:
    """Stats fold finishes into their table, a write: on a full disk they count without it."""
    with (
        tiny_disk(tmp_path / "disk") as disk,
        App(f"sqlite:///{disk / 'q.db'}", **STORE_OPTIONS["sqlite"]) as app,
    ):
        app.migrate()

        @app.task()
        def small(n: int) -> int:
            return n

        for n in range(3):
            small.enqueue(n)
        app.run_worker(concurrency=1, burst=True)
        # An empty write-ahead log: the fold's write needs room it cannot have.
        with closing(sqlite3.connect(disk / "q.db")) as conn:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
        filler = fill(disk, leave=0)
        try:
            with pytest.raises(StoreUnavailableError):
                small.enqueue(BIG_ARGS)  # the disk is full for writes indeed
            assert app.stats().count(JobState.SUCCEEDED) == 3
        finally:
            filler.unlink()
        assert app.stats().count(JobState.SUCCEEDED) == 3
