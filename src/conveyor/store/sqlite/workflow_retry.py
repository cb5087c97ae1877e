"""The SQLite store's retry of a workflow from its failures: chosen by one
statement and applied by the next ones, in one write transaction
(workflow_retry.sql; the rule is conveyor.store.workflow_retry's)."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

from conveyor.job import EventKind
from conveyor.store.sql import load_queries
from conveyor.store.sqlite.base import SQLiteBase
from conveyor.store.workflow_retry import key_taken

_R = load_queries("conveyor.store.sqlite", "workflow_retry.sql")
#: The event of each job put back, by the state it is put in.
_EVENTS = json.dumps({"queued": EventKind.MANUAL_RETRY, "waiting": EventKind.MANUAL_RETRY})


class SQLiteWorkflowRetry(SQLiteBase):
    """Mixed into SQLiteStore, whose write transaction it runs in."""

    def workflow_retry(self, workflow_id: str, now: datetime) -> list[int]:
        now_ts = now.timestamp()
        try:
            with self._write() as conn:
                picked = conn.execute(_R["workflow_retry_pick"], {"workflow": workflow_id})
                rows = picked.fetchall()
                if not rows:
                    return []
                items = json.dumps([[job_id, pending] for job_id, _, _, pending in rows])
                params = {"items": items, "now": now_ts}
                ids = sorted(r[0] for r in conn.execute(_R["workflow_retry_jobs"], params))
                chosen = json.dumps(ids)
                conn.execute(_R["workflow_retry_edges"], {"ids": chosen})
                conn.execute(_R["workflow_retry_flows"], {"items": items})
                events = {"ids": chosen, "kinds": _EVENTS, "now": now_ts}
                conn.execute(_R["workflow_retry_events"], events)
                # They are no longer finished: off the counts of the state each left.
                deltas = [[queue, state, -1] for job_id, queue, state, _ in rows if job_id in ids]
                conn.execute(_R["workflow_retry_uncount"], {"deltas": json.dumps(deltas)})
        except sqlite3.IntegrityError as exc:
            if "UNIQUE" not in str(exc):
                raise
            raise key_taken(workflow_id) from exc
        return ids
