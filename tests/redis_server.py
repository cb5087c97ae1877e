"""A throwaway Redis server for the test suite.

``RedisServer`` starts ``redis-server`` on a free loopback port with its data
in a temporary directory (append-only file on, RDB snapshots off), and removes
everything again on ``stop()``. ``restart()`` kills and starts the same server
on the same port and directory, so tests can simulate a Redis crash mid-run:
what the append-only file holds comes back.

Only the standard library is used here: the server is checked with a raw PING.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["RedisServer", "RedisServerError"]

_INSTALL_HINT = (
    "install redis-server (`apt-get install -y redis-server`, or run scripts/ensure-redis.sh), "
    "or point the tests at an existing server with CONVEYOR_TEST_REDIS_DSN"
)


class RedisServerError(RuntimeError):
    """The throwaway Redis server could not be started."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    def __init__(self, *, appendfsync: str = "everysec", extra: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerError(f"redis-server not found; {_INSTALL_HINT}")
        self.binary = binary
        self.appendfsync = appendfsync
        #: More options for redis-server, e.g. ("--requirepass", "secret").
        self.extra = list(extra)
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    @property
    def dsn(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
            *self.extra,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.dir / "redis.log"
                said = log.read_text()[-2000:] if log.exists() else "(no log)"
                raise RedisServerError(f"redis-server exited at start: {said}")
            if self._answers():
                return
            time.sleep(0.05)
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within 20 s")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                # +PONG once ready; -LOADING while it replays the append-only file;
                # -NOAUTH when a password is required (it is up).
                return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def kill(self) -> None:
        """Stop the server at once (SIGKILL): what it had not written to disk is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        """A crash and a restart on the same port and data directory."""
        self.kill()
        self.start()

    def shutdown(self) -> None:
        """Stop the server cleanly and keep its data: ``start()`` brings it back (an outage)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
        with contextlib.suppress(OSError):
            shutil.rmtree(self.dir)
