"""What a run costs a PostgreSQL server: WAL bytes and the server's CPU time.

``Window`` brackets one side of a benchmark: ``begin()`` takes a CHECKPOINT (so
that every side starts with the same full-page-image state: the first change of
each page after a checkpoint logs the whole page when full_page_writes is on)
and reads ``pg_current_wal_lsn()`` and the CPU time of the server's process
tree; ``end()`` waits for the other sessions to go and reads both again.

Server CPU is user + system time from /proc, summed over the postmaster and
every process below it, including the time of the processes that already ended
(the postmaster's reaped children: cutime, cstime). It needs the server on this
machine; otherwise the CPU figure is left out. ``breakdown()`` reads the
window's WAL with pg_waldump (when its files are readable here) and sums the
bytes by relation and record kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU of ``root`` and all its descendants, ended ones included."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        # utime, stime, cutime, cstime (stat fields 14-17)
        ticks[pid] = sum(int(f) for f in fields[11:15])
    tree = {root}
    grew = True
    while grew:
        below = {pid for pid, parent in parents.items() if parent in tree} - tree
        grew = bool(below)
        tree |= below
    return sum(ticks.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


@dataclass
class Cost:
    wal_bytes: int
    #: None when the server's processes are not visible from here.
    server_cpu: float | None
    start_lsn: str
    end_lsn: str
    #: (relation, record kind) -> (records, bytes), from pg_waldump; empty if unreadable.
    records: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)


class Window:
    """Measures the WAL and server CPU of what happens between begin() and end()."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        backend = self.conn.execute("SELECT pg_backend_pid()").fetchone()
        self.postmaster: int | None = None
        # Our session's server process, if it runs on this machine (a remote
        # server's pid may name some other local process: check its name).
        proc = Path(f"/proc/{backend[0]}") if backend else None
        if proc and proc.exists() and "postgres" in (proc / "cmdline").read_text():
            self.postmaster = int(_stat(int(proc.name))[1])
        self.wal_dir: Path | None = None
        with contextlib.suppress(psycopg.Error):  # reading it needs pg_read_all_settings
            row = self.conn.execute("SHOW data_directory").fetchone()
            self.wal_dir = Path(row[0]) / "pg_wal" if row else None
        self._start: tuple[str, float | None] = ("", None)

    def _cpu(self) -> float | None:
        return tree_cpu_seconds(self.postmaster) if self.postmaster else None

    def _lsn(self) -> str:
        row = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        return str(row[0])

    def begin(self) -> None:
        self.settle()
        try:
            self.conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            raise SystemExit(
                "the cost figures start each side with a CHECKPOINT, which this role may not "
                "run: connect as a superuser or a member of pg_checkpoint (--pg-dsn), or leave "
                "--pg-dsn out to use a throwaway server"
            ) from None
        self._start = (self._lsn(), self._cpu())

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until no other client session is left (their backends' work is done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self.conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.05)

    def end(self) -> Cost:
        self.settle()
        end_lsn, end_cpu = self._lsn(), self._cpu()
        start_lsn, start_cpu = self._start
        row = self.conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (end_lsn, start_lsn)
        ).fetchone()
        assert row is not None
        cpu = end_cpu - start_cpu if end_cpu is not None and start_cpu is not None else None
        cost = Cost(int(row[0]), cpu, start_lsn, end_lsn)
        cost.records = self.breakdown(start_lsn, end_lsn)
        # Clean the side's dead rows now, outside every window, so that another
        # side's window does not pay for them.
        self.conn.execute("VACUUM")
        return cost

    def relation_names(self) -> dict[str, str]:
        rows = self.conn.execute(
            "SELECT pg_relation_filenode(oid)::text, relname FROM pg_class"
            " WHERE pg_relation_filenode(oid) IS NOT NULL"
        ).fetchall()
        return {str(node): str(name) for node, name in rows}

    def breakdown(self, start: str, end: str) -> dict[tuple[str, str], tuple[int, int]]:
        """The window's WAL records by (relation, kind): count and bytes (pg_waldump)."""
        if self.wal_dir is None or not os.access(self.wal_dir, os.R_OK):
            return {}
        from pg_server import find_bin_dir

        command = [str(find_bin_dir() / "pg_waldump"), "-p", str(self.wal_dir),
                   "-s", start, "-e", end]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, check=False).stdout
        names = self.relation_names()
        totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for line in out.splitlines():
            match = RECORD.match(line)
            if not match:
                continue
            rmgr, size, kind = match["rmgr"], int(match["tot"]), match["kind"]
            rel = BLOCK.search(line)
            relation = names.get(rel["node"], f"filenode {rel['node']}") if rel else "-"
            total = totals[(relation, f"{rmgr} {kind}")]
            total[0] += 1
            total[1] += size
        return {key: (n, size) for key, (n, size) in totals.items()}

    def close(self) -> None:
        self.conn.close()


RECORD = re.compile(
    r"rmgr: (?P<rmgr>\S+)\s+len \(rec/tot\):\s*\d+/\s*(?P<tot>\d+),.*?desc: (?P<kind>[A-Z_+0-9]+)"
)
BLOCK = re.compile(r"blkref #0: rel \d+/\d+/(?P<node>\d+)")
