"""OperatorStore on SQLite: listings, counts, bulk actions, retries, purges, pauses."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from conveyor.job import Event, Job, JobState, utcnow
from conveyor.store.counting import assemble_stats
from conveyor.store.records import (
    FIRST_PAGE,
    TAKEN_BACK_ERROR,
    BatchStatus,
    Finish,
    JobSelection,
    Page,
    Purge,
    Stats,
    WorkerInfo,
)
from conveyor.store.selection import count_query, driven, keep_state, newest_first, select_queries
from conveyor.store.sqlite import flows as sqlite_flows
from conveyor.store.sqlite.base import (
    _Q,
    _away,
    _dt_required,
    _row_to_event,
    _row_to_job,
    _ts,
    immediate_transaction,
)
from conveyor.store.sqlite.core import CoreMixin
from conveyor.store.sqlite.signals import with_children


class OperationsMixin(CoreMixin):
    """What an operator does to jobs and queues (``OperatorStore``)."""

    def event_list(self, job_id: int) -> list[Event]:
        rows = self._conn().execute(_Q["event_list"], {"job_id": job_id})
        return [_row_to_event(r) for r in rows]

    def stats(self, now: datetime) -> Stats:
        self._fold_finished_counts()
        conn = self._conn()
        # One read transaction, so the counts and ages describe the same moment.
        conn.execute("BEGIN")
        try:
            counts = conn.execute(_Q["stats_counts"]).fetchall()
            counts += [(q, "waiting", n) for q, n in sqlite_flows.waiting_counts(conn)]
            queued = conn.execute(_Q["stats_queued"], {"now": _ts(now)}).fetchall()
            retrying = dict(conn.execute(_Q["stats_retrying"], {"now": _ts(now)}).fetchall())
            since = _ts(now - timedelta(minutes=1))
            finished = conn.execute(_Q["stats_finished_since"], {"since": since}).fetchone()[0]
            paused = {name for name, p in conn.execute(_Q["queue_list"]) if p}
            limits = self._limit_usage(conn, now)
        finally:
            conn.execute("COMMIT")
        return assemble_stats(
            counts, queued, retrying, paused, lambda oldest: _ts(now) - oldest, finished, limits
        )

    def _fold_finished_counts(self) -> None:
        """Add the finishes recorded since the last fold to finished_counts.

        Stats read the table plus the events after its offset, and are exact
        either way: folding keeps that tail short. A short write, none when
        nothing happened since the last fold, and skipped when another writer
        holds the lock (a long purge, a migration): stats never wait for it.
        """
        conn = self._conn()
        folded, newest = conn.execute(_Q["finished_counts_offset"]).fetchone()
        if newest <= folded or not self._writer.acquire(blocking=False):
            return
        try:
            conn.execute("PRAGMA busy_timeout = 0")  # another process's write: skip
            with immediate_transaction(conn):
                # Read again under the write lock: another process may have folded.
                folded, newest = conn.execute(_Q["finished_counts_offset"]).fetchone()
                if newest > folded:
                    conn.execute(_Q["finished_counts_fold"], {"upto": newest})
                    conn.execute(_Q["finished_counts_fold_offset"], {"upto": newest})
                    conn.execute(_Q["finished_counts_prune"])
        except sqlite3.OperationalError as exc:
            # Locked by another process, or no room to write the fold (a full
            # disk): stats are exact without it, and read what they can.
            if _away(exc) is None:
                raise
        finally:
            # Back to the store's own wait (milliseconds: an integer we made).
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            self._writer.release()

    def _states(self, conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Each job's (queue, state), read in the caller's write transaction."""
        rows = conn.execute(_Q["job_states"], {"ids": json.dumps(list(ids))})
        return {job_id: (queue, state) for job_id, queue, state in rows}

    def _uncount(self, conn: sqlite3.Connection, left: list[tuple[str, str]]) -> None:
        """Take jobs off the finished (queue, state) counts they left (a manual retry)."""
        if left:
            deltas = json.dumps([[queue, state, -1] for queue, state in left])
            conn.execute(_Q["finished_counts_add"], {"deltas": deltas})

    def batch_status(self, batch: str) -> BatchStatus:
        rows = self._conn().execute(_Q["batch_counts"], {"batch": batch}).fetchall()
        return BatchStatus(batch, {state: count for state, count in sorted(rows)})

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        now_ts = _ts(now)
        params = {"queue": queue, "before": _ts(failed_before), "now": now_ts, "limit": limit}
        with self._write() as conn:
            rows = conn.execute(_Q["job_retry_failed"], params).fetchall()
            ids = [job_id for job_id, _ in rows]
            self._uncount(conn, [(queue, JobState.FAILED.value) for _, queue in rows])
            self._record(conn, "retry", ids, now_ts)
        return ids

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, True, now)

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._set_paused(queue, False, now)

    def _set_paused(self, queue: str, paused: bool, now: datetime) -> None:
        with self._write() as conn:
            conn.execute(_Q["queue_set_paused"], {"name": queue, "paused": paused, "now": _ts(now)})

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row[0],
                host=row[1],
                pid=row[2],
                queues=json.loads(row[3]),
                concurrency=row[4],
                jobs_in_hand=row[5],
                started_at=_dt_required(row[6]),
                last_seen_at=_dt_required(row[7]),
                control=json.loads(row[8]) if row[8] else {},
            )
            for row in self._conn().execute(_Q["worker_list"])
        ]

    def _selection_params(self, params: dict[str, Any], now: datetime) -> dict[str, Any]:
        ids = params.get("ids")
        return {**params, "ids": None if ids is None else json.dumps(ids), "now": _ts(now)}

    def job_select(
        self, selection: JobSelection, now: datetime, page: Page = FIRST_PAGE
    ) -> list[Job]:
        conn = self._conn()
        pages = [
            [
                _row_to_job(r)
                for r in conn.execute(
                    driven(_Q, "job_select", driver), self._selection_params(params, now)
                )
            ]
            for driver, params in select_queries(
                selection, page, self._queue_names, self._newest_id
            )
        ]
        return newest_first(pages, page.limit)

    def _newest_id(self) -> int:
        newest: int = self._conn().execute(_Q["job_newest_id"]).fetchone()[0]
        return newest

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        driver, params = count_query(selection, self._newest_id)
        statement = driven(_Q, "job_count", driver)
        rows = self._conn().execute(statement, self._selection_params(params, now)).fetchall()
        return keep_state(dict(rows), selection.state)

    def _change_many(
        self, name: str, action: str | None, job_ids: Sequence[int], now: datetime
    ) -> list[int]:
        """Run a statement on the jobs of ``job_ids`` and record ``action``'s events."""
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = sorted(r[0] for r in conn.execute(_Q[name], params))
            if action is not None:
                self._record(conn, action, ids, now_ts)
        return ids

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            before = self._states(conn, job_ids)
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = sorted(r[0] for r in conn.execute(_Q["job_retry_many"], params))
            self._uncount(conn, [before[i] for i in ids])
            self._record(conn, "retry", ids, now_ts)
        return ids

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        now_ts = _ts(now)
        with self._write() as conn:
            job_ids = with_children(conn, job_ids)  # of the parents parked by ctx.wait
            params = {"ids": json.dumps(list(job_ids)), "now": now_ts}
            ids = [r[0] for r in conn.execute(_Q["job_cancel_many_queued"], params)]
            ids += [r[0] for r in conn.execute(_Q["job_cancel_many_running"], params)]
            ids.sort()
            self._record(conn, "cancel", ids, now_ts)
            # Waiting jobs, and the jobs waiting for the jobs cancelled now.
            ids = sorted(ids + sqlite_flows.cancel_waiting(conn, job_ids, now_ts))
            sqlite_flows.release(conn, ids, now_ts)
        return ids

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        if not job_ids:
            return []
        with self._write() as conn:
            params = {"ids": json.dumps(list(job_ids))}
            ids = sorted(r[0] for r in conn.execute(_Q["job_delete_many_select"], params))
            sqlite_flows.orphan(conn, ids, _ts(utcnow()))  # the jobs waiting for them go on
            self._delete_jobs(conn, ids)
        return ids

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._change_many("job_run_now", "run_now", job_ids, now)

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        params = {"ids": json.dumps(list(job_ids))}
        held = self._conn().execute(_Q["job_running_leases"], params).fetchall()
        finishes = [Finish(i, token, "take_back", error=TAKEN_BACK_ERROR) for i, token in held]
        return self.job_finish(finishes, now)

    def job_purge_where(self, purge: Purge, limit: int = 10_000) -> int:
        params = {**_purge_params(purge), "limit": limit}
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(_Q["job_purge_where_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return len(ids)

    def job_purge_count(self, purge: Purge) -> int:
        count: int = self._conn().execute(_Q["job_purge_count"], _purge_params(purge)).fetchone()[0]
        return count

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        params = {"queue": queue, "keep": keep, "limit": limit, "states": json.dumps(list(states))}
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(_Q["job_purge_beyond_select"], params)]
            ids = sqlite_flows.keep(conn, ids)  # parents of jobs yet to run stay
            self._delete_jobs(conn, ids)
        return len(ids)

    def queue_delete(self, queue: str) -> None:
        with self._write() as conn:
            conn.execute(_Q["queue_delete"], {"name": queue})


def _purge_params(purge: Purge) -> dict[str, Any]:
    """The parameters of job_purge_where_select and job_purge_count."""
    return {
        "before": _ts(purge.finished_before),
        "states": json.dumps(list(purge.states)),
        "queue": purge.queue,
        "by_policy": purge.by_policy,
    }
