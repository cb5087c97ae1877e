"""The floor of a lease queue on PostgreSQL, in raw SQL (raw_postgres.sql, lease_*).

    python benchmarks/raw_lease.py DSN plain|events     # a worker: drains the queue, exits

What any queue with leases must write, and nothing more: claim 100 ready jobs
under one lease token with SKIP LOCKED, then finish them in one statement by id
and token ("events": with one event row per attempt's end). peers.py runs it as
the yardstick for the database's cost per job; ``prepare`` and ``enqueue`` are
its other half.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import psycopg

from conveyor.store.sql import parse_queries

HERE = Path(__file__).resolve().parent

QUEUE = "peers"
CLAIM = 100
Q = parse_queries((HERE / "raw_postgres.sql").read_text(), where="raw_postgres.sql")


def prepare(dsn: str) -> None:
    """Create the tables and indexes (outside any measured window)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("lease_create", "lease_index", "lease_events_create", "lease_events_index"):
            conn.execute(Q[name])


def enqueue(dsn: str, jobs: int) -> None:
    """``jobs`` no-op jobs, 1,000 to a statement, as the other sides enqueue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, jobs, 1000):
            args = ["[]"] * min(1000, jobs - start)
            conn.execute(Q["lease_insert"], {"queue": QUEUE, "task": "noop", "args": args})


def remaining_sql() -> str:
    return "SELECT count(*) FROM lease_jobs WHERE state IN ('queued', 'running')"


def work(dsn: str, events: bool) -> int:
    """Claim and finish until the queue is empty; the jobs done."""
    finish = Q["lease_finish_events" if events else "lease_finish"]
    worker = f"raw-{os.getpid()}"
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            token = uuid.uuid4().hex
            params = {"worker": worker, "token": token, "queue": QUEUE, "limit": CLAIM}
            claimed = conn.execute(Q["lease_claim"], params).fetchall()
            if not claimed:
                return done
            # The handler: a no-op whose result is JSON null.
            json.dumps(None)
            ids = [row[0] for row in claimed]
            conn.execute(finish, {"ids": ids, "tokens": [row[1] for row in claimed]})
            done += len(ids)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("plain", "events"):
        raise SystemExit("usage: python benchmarks/raw_lease.py DSN plain|events")
    work(sys.argv[1], sys.argv[2] == "events")
