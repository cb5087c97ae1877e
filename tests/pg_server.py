"""A throwaway PostgreSQL cluster for the test suite.

``PgServer`` initialises a fresh cluster in a temporary directory, starts it on
a free loopback port, creates the ``conveyor_test`` database and removes
everything again on ``stop()``. ``restart()`` stops and starts the same cluster
on the same port, so tests can simulate a database restart mid-run.

When running as root (as in CI), the server binaries are run as the
``postgres`` system user through ``runuser``, because ``initdb`` and
``postgres`` refuse to run as root.

Only the standard library is used here; the server is reached through its own
client binaries (``createdb``).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["PgServer", "PgServerError", "find_bin_dir"]

PREFERRED_MAJOR = "15"
DATABASE = "conveyor_test"
SUPERUSER = "postgres"

_INSTALL_HINT = (
    "install the PostgreSQL 15 server binaries, e.g. `apt-get install -y postgresql-15` "
    "(or `apt-get install -y postgresql`, or run scripts/ensure-postgres.sh), "
    "or point the tests at an existing server with CONVEYOR_TEST_PG_DSN"
)


class PgServerError(RuntimeError):
    """The throwaway PostgreSQL server could not be set up, started or stopped."""


def _has_server_binaries(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(directory: Path) -> tuple[int, int]:
    # /usr/lib/postgresql/<major>/bin: prefer PREFERRED_MAJOR, then the newest.
    major = directory.parent.name
    preferred = 1 if major == PREFERRED_MAJOR else 0
    return (preferred, int(major) if major.isdigit() else -1)


def find_bin_dir() -> Path:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Looks at ``CONVEYOR_PG_BINDIR``, then ``initdb`` on ``PATH`` (symlinks
    resolved), then ``/usr/lib/postgresql/*/bin``.
    """
    override = os.environ.get("CONVEYOR_PG_BINDIR")
    if override:
        if _has_server_binaries(Path(override)):
            return Path(override)
        raise PgServerError(
            f"CONVEYOR_PG_BINDIR={override} does not hold initdb, pg_ctl and postgres; "
            f"{_INSTALL_HINT}"
        )
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
        candidates.append(Path(on_path).parent)
    debian_dirs = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")]
    candidates.extend(sorted(debian_dirs, key=_version_key, reverse=True))
    for directory in candidates:
        if _has_server_binaries(directory):
            return directory
    searched = ", ".join(str(c) for c in candidates) or "nothing found"
    raise PgServerError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in "
        f"/usr/lib/postgresql/*/bin (looked at: {searched}); {_INSTALL_HINT}"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class PgServer:
    """A throwaway PostgreSQL cluster on 127.0.0.1.

    Usage::

        server = PgServer()
        server.start()
        try:
            ...  # connect to server.dsn
            server.restart()  # same data, same port
        finally:
            server.stop()  # also deletes the cluster

    It is also a context manager (``with PgServer() as server: ...``).
    """

    def __init__(
        self,
        *,
        bin_dir: Path | str | None = None,
        base_dir: Path | str | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 60.0,
        extra_options: tuple[str, ...] = (),
    ) -> None:
        self._bin_dir_arg = Path(bin_dir) if bin_dir is not None else None
        self._base_parent = Path(base_dir) if base_dir is not None else None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.extra_options = extra_options
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.base_dir: Path | None = None
        self._bin_dir: Path | None = None
        self._as_postgres = os.geteuid() == 0
        self._running = False
        self._atexit_registered = False

    # ------------------------------------------------------------------ paths

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = self._bin_dir_arg or find_bin_dir()
        return self._bin_dir

    @property
    def data_dir(self) -> Path:
        return self._require_base() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._require_base() / "sock"

    @property
    def log_file(self) -> Path:
        return self._require_base() / "postgres.log"

    @property
    def running(self) -> bool:
        return self._running

    @property
    def major_version(self) -> str:
        """The cluster's major version, e.g. ``"15"`` (read from ``PG_VERSION``)."""
        return (self.data_dir / "PG_VERSION").read_text().strip()

    def dsn_for(self, dbname: str) -> str:
        if self.port is None:
            raise PgServerError("PgServer has not been started")
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{dbname}"

    @property
    def dsn(self) -> str:
        """DSN of the ``conveyor_test`` database."""
        return self.dsn_for(DATABASE)

    def _require_base(self) -> Path:
        if self.base_dir is None:
            raise PgServerError("PgServer has not been started")
        return self.base_dir

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Create (on first call) and start the cluster. Idempotent while running."""
        if self._running:
            return
        if self.base_dir is None:
            self._init_cluster()
            last_error: PgServerError | None = None
            # The free port may be taken between probing and binding; retry a few times.
            for _ in range(5):
                self.port = _free_port()
                try:
                    self._pg_ctl_start()
                except PgServerError as exc:
                    last_error = exc
                    if "could not bind" not in str(exc) and "in use" not in str(exc):
                        break
                else:
                    last_error = None
                    break
            if last_error is not None:
                self._remove_base_dir()
                raise last_error
            self._register_atexit()
            try:
                self._create_database(DATABASE)
            except PgServerError:
                self.stop()
                raise
        else:
            self._pg_ctl_start()

    def restart(self) -> None:
        """Stop the server and start it again on the same data directory and port."""
        self._shutdown()
        self._pg_ctl_start()

    def halt(self) -> None:
        """Stop the server, keeping its data directory and port: ``start()`` brings it back."""
        self._shutdown()

    def stop(self) -> None:
        """Stop the server and delete its data directory. Safe to call repeatedly."""
        try:
            self._shutdown()
        finally:
            self._remove_base_dir()
            if self._atexit_registered:
                atexit.unregister(self.stop)
                self._atexit_registered = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -------------------------------------------------------------- internals

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True

    def _cmd(self, *argv: str) -> list[str]:
        if not self._as_postgres:
            return list(argv)
        runuser = shutil.which("runuser") or next(
            (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.access(p, os.X_OK)), None
        )
        if runuser is None:
            raise PgServerError(
                "running as root, but `runuser` (util-linux) is missing; it is needed to run "
                "the PostgreSQL server binaries as the postgres user"
            )
        return [runuser, "-u", SUPERUSER, "--", *argv]

    def _run(self, argv: list[str], *, timeout: float, what: str) -> None:
        try:
            proc = subprocess.run(
                argv,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise PgServerError(f"{what}: {exc}; {_INSTALL_HINT}") from exc
        except subprocess.TimeoutExpired as exc:
            raise PgServerError(f"{what}: timed out after {timeout:.0f}s") from exc
        if proc.returncode != 0:
            log = _tail(self.log_file) if self.base_dir is not None else ""
            details = proc.stdout.strip()
            if log:
                details += f"\n--- server log ({self.log_file}) ---\n{log}"
            raise PgServerError(
                f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{details}"
            )

    def _init_cluster(self) -> None:
        bin_dir = self.bin_dir
        owner: pwd.struct_passwd | None = None
        if self._as_postgres:
            try:
                owner = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PgServerError(
                    f"running as root, but there is no '{SUPERUSER}' system user to run the "
                    f"server as; {_INSTALL_HINT}"
                ) from None
        base = Path(tempfile.mkdtemp(prefix="conveyor-pg-", dir=self._base_parent))
        self.base_dir = base
        try:
            (base / "sock").mkdir()
            if owner is not None:
                for path in (base, base / "sock"):
                    os.chown(path, owner.pw_uid, owner.pw_gid)
            base.chmod(0o755)
            self._run(
                self._cmd(
                    str(bin_dir / "initdb"),
                    "--no-sync",
                    "-A",
                    "trust",
                    "-U",
                    SUPERUSER,
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "-D",
                    str(self.data_dir),
                ),
                timeout=180,
                what="initdb",
            )
        except BaseException:
            self._remove_base_dir()
            raise

    def _server_options(self) -> str:
        assert self.port is not None
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-p {self.port}",
            f"-k {self.socket_dir}",
            "-c fsync=off",
            "-c full_page_writes=off",
            "-c max_connections=200",
            # Spark writes commit in parallel pieces only with room for prepared transactions.
            "-c max_prepared_transactions=64",
            *self.extra_options,
        ]
        return " ".join(options)

    def _pg_ctl_start(self) -> None:
        self._run(
            self._cmd(
                str(self.bin_dir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                self._server_options(),
                "-w",
                "-t",
                str(int(self.start_timeout)),
                "start",
            ),
            timeout=self.start_timeout + 30,
            what="pg_ctl start",
        )
        self._running = True

    def _create_database(self, name: str) -> None:
        assert self.port is not None
        self._run(
            [
                str(self.bin_dir / "createdb"),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                SUPERUSER,
                name,
            ],
            timeout=60,
            what=f"createdb {name}",
        )

    def _read_pid(self) -> int | None:
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        try:
            return int(first_line.strip())
        except ValueError:
            return None

    def _wait_pidfile_gone(self, timeout: float) -> bool:
        pidfile = self.data_dir / "postmaster.pid"
        deadline = time.monotonic() + timeout
        while pidfile.exists():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _shutdown(self) -> None:
        """Stop the postmaster (fast shutdown) and wait for its pid file to go away.

        The pid file disappearing is the signal that shutdown finished: the
        process itself may linger as a zombie until it is reaped, so polling it
        with ``kill(pid, 0)`` is not reliable.
        """
        if self.base_dir is None:
            return
        pid = self._read_pid()
        if pid is None:
            self._running = False
            return
        try:
            os.kill(pid, signal.SIGINT)  # "fast" shutdown: abort sessions, checkpoint
        except ProcessLookupError:
            # Stale pid file from a crashed server; postgres removes it on next start.
            self._running = False
            return
        if not self._wait_pidfile_gone(self.stop_timeout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGQUIT)  # "immediate" shutdown
            if not self._wait_pidfile_gone(10):
                raise PgServerError(
                    f"PostgreSQL (pid {pid}) did not shut down within {self.stop_timeout:.0f}s"
                    f"\n--- server log ---\n{_tail(self.log_file)}"
                )
        self._running = False

    def _remove_base_dir(self) -> None:
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None
