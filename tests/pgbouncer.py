"""A throwaway PgBouncer in transaction mode in front of the test suite's PostgreSQL.

``PgBouncer(server_dsn)`` writes a configuration in a temporary directory,
starts ``pgbouncer`` on a free loopback port (as the ``postgres`` system user
when running as root: PgBouncer refuses root) and gives ``dsn_for(dbname)``.
Installed by ``make ensure-postgres``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from psycopg.conninfo import conninfo_to_dict


def _binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        raise RuntimeError("pgbouncer is not installed: run `make ensure-postgres`")
    return found


class PgBouncer:
    def __init__(self, server_dsn: str) -> None:
        self.server = conninfo_to_dict(server_dsn)
        self.user = str(self.server.get("user") or "postgres")
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
        self._process: subprocess.Popen[bytes] | None = None

    def dsn_for(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        host = self.server.get("host") or "127.0.0.1"
        (self._dir / "users.txt").write_text(f'"{self.user}" ""\n')
        (self._dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={self.server.get('port', 5432)} user={self.user}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "auth_type = trust\n"
            f"auth_file = {self._dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            # The session settings conveyor sends in the options startup parameter:
            # a pooler that shares server connections between clients cannot keep them.
            "ignore_startup_parameters = extra_float_digits,options\n"
            "unix_socket_dir =\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
        )
        argv = [_binary(), str(self._dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self._dir, user="postgres")
            for path in self._dir.iterdir():
                shutil.chown(path, user="postgres")
            argv = ["runuser", "-u", "postgres", "--", *argv]
        self._process = subprocess.Popen(argv)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not start; see {self._dir / 'pgbouncer.log'}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None
        shutil.rmtree(self._dir, ignore_errors=True)

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
