"""OperatorStore on PostgreSQL: listings, counts, bulk actions, retries, purges, pauses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from psycopg import errors as pg_errors

from conveyor.errors import SchemaMissingError
from conveyor.job import Event, Job
from conveyor.store.counting import assemble_stats
from conveyor.store.postgres import flows as pg_flows
from conveyor.store.postgres.base import _Q, _row_to_event, _row_to_job
from conveyor.store.postgres.core import CoreMixin
from conveyor.store.postgres.signals import with_children
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


class OperationsMixin(CoreMixin):
    """What an operator does to jobs and queues (``OperatorStore``)."""

    def event_list(self, job_id: int) -> list[Event]:
        with self._conn() as conn:
            return [_row_to_event(r) for r in conn.execute(_Q["event_list"], {"job_id": job_id})]

    def stats(self, now: datetime) -> Stats:
        self._fold_finished_counts()
        with self._tx() as conn:
            # One transaction at REPEATABLE READ: every figure describes one moment.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # Planned for the values: a generic plan of the events after the
            # offset, or of the last minute's finishes, reads the whole table.
            conn.execute(_Q["plan_for_values"])
            folded = conn.execute(_Q["stats_folded"]).fetchone()
            if folded is None:
                raise SchemaMissingError(
                    f"{self.description}: table finished_counts_folded has lost its one row "
                    "(emptied by hand?); restore a backup, or run migration 011's fill again"
                )
            offset = {"xid": folded[0], "seq": folded[1]}
            counts = conn.execute(_Q["stats_counts"], offset).fetchall()
            counts += [(q, "waiting", n) for q, n in pg_flows.waiting_counts(conn)]
            queued = conn.execute(_Q["stats_queued"], {"now": now}).fetchall()
            retrying = dict(conn.execute(_Q["stats_retrying"], {"now": now}).fetchall())
            since = now - timedelta(minutes=1)
            row = conn.execute(_Q["stats_finished_since"], {"since": since}).fetchone()
            finished = row[0] if row else 0
            paused = {name for name, p in conn.execute(_Q["queue_list"]) if p}
            limits = self._limit_usage(conn, now)
        return assemble_stats(
            counts,
            queued,
            retrying,
            paused,
            lambda oldest: (now - oldest).total_seconds(),
            finished,
            limits,
        )

    def _fold_finished_counts(self) -> None:
        """Add the finishes recorded since the last fold to finished_counts.

        Stats read the table plus the events after its offset, and are exact
        either way: folding keeps that tail short. Skipped while another fold
        or a delete holds the offset (the next stats call folds), and on a
        read-only server (a hot standby: stats there read without folding).
        """
        try:
            with self._tx() as conn:
                offset = conn.execute(_Q["finished_counts_lock_fold"]).fetchone()
                if offset is None:
                    return
                conn.execute(_Q["plan_for_values"])  # the events after this offset only
                conn.execute(_Q["finished_counts_fold"], {"xid": offset[0], "seq": offset[1]})
                conn.execute(_Q["finished_counts_prune"])
        except pg_errors.ReadOnlySqlTransaction:
            return

    def batch_status(self, batch: str) -> BatchStatus:
        with self._conn() as conn:
            rows = conn.execute(_Q["batch_counts"], {"batch": batch}).fetchall()
        return BatchStatus(batch, {state: count for state, count in sorted(rows)})

    def job_retry_failed(
        self, queue: str | None, failed_before: datetime, now: datetime, limit: int = 1000
    ) -> list[int]:
        params = {"queue": queue, "before": failed_before, "now": now, "limit": limit}
        for _ in range(3):
            try:
                with self._conn() as conn:
                    return [r[0] for r in conn.execute(_Q["job_retry_failed"], params)]
            except pg_errors.UniqueViolation:
                # A producer enqueued a job with the key of one being retried, after
                # the statement's snapshot: the key's live job is theirs. The next
                # try sees it and leaves that job failed.
                continue
        return []

    def queue_pause(self, queue: str, now: datetime) -> None:
        self._change("queue_set_paused", {"name": queue, "paused": True, "now": now})

    def queue_resume(self, queue: str, now: datetime) -> None:
        self._change("queue_set_paused", {"name": queue, "paused": False, "now": now})

    def worker_list(self) -> list[WorkerInfo]:
        with self._conn() as conn:
            rows = conn.execute(_Q["worker_list"]).fetchall()
        return [
            WorkerInfo(
                id=r[0],
                host=r[1],
                pid=r[2],
                queues=json.loads(r[3]),
                concurrency=r[4],
                jobs_in_hand=r[5],
                started_at=r[6],
                last_seen_at=r[7],
                control=json.loads(r[8]) if r[8] else {},
            )
            for r in rows
        ]

    def job_select(
        self, selection: JobSelection, now: datetime, page: Page = FIRST_PAGE
    ) -> list[Job]:
        with self._tx() as conn:
            conn.execute(_Q["plan_for_values"])

            def queue_names() -> list[str]:
                return [row[0] for row in conn.execute(_Q["queue_names"]).fetchall()]

            def newest_id() -> int:
                row = conn.execute(_Q["job_newest_id"]).fetchone()
                return int(row[0]) if row else 0

            pages = [
                [
                    _row_to_job(r)
                    for r in conn.execute(driven(_Q, "job_select", driver), {**params, "now": now})
                ]
                for driver, params in select_queries(selection, page, queue_names, newest_id)
            ]
        return newest_first(pages, page.limit)

    def job_count_selected(self, selection: JobSelection, now: datetime) -> dict[str, int]:
        with self._tx() as conn:

            def newest_id() -> int:
                row = conn.execute(_Q["job_newest_id"]).fetchone()
                return int(row[0]) if row else 0

            driver, params = count_query(selection, newest_id)
            conn.execute(_Q["plan_for_values"])
            statement = driven(_Q, "job_count", driver)
            rows = conn.execute(statement, {**params, "now": now}).fetchall()
        return keep_state({state: int(n) for state, n in rows}, selection.state)

    def job_retry_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        for _ in range(3):
            try:
                return self._change_ids("job_retry_many", job_ids, now)
            except pg_errors.UniqueViolation:
                # A producer took the key of a job being retried, after this
                # statement's snapshot (see job_retry_failed): look again.
                continue
        return []

    def job_cancel_many(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        if not job_ids:
            return []
        with self._tx() as conn:
            job_ids = with_children(conn, job_ids)  # of the parents parked by ctx.wait
            params = {"ids": list(job_ids), "now": now}
            ids = [r[0] for r in conn.execute(_Q["job_cancel_many"], params).fetchall()]
            # Waiting jobs, and the jobs waiting for the jobs cancelled now.
            ids += pg_flows.cancel_waiting(conn, job_ids, now)
            pg_flows.release(conn, ids, now)
        return sorted(ids)

    def job_delete_many(self, job_ids: Sequence[int]) -> list[int]:
        if not job_ids:
            return []
        with self._tx() as conn:
            conn.execute(_Q["finished_counts_lock"])  # first, as every delete takes it
            pg_flows.orphan(conn, job_ids, None)  # the jobs waiting for them go on
            deleted = [r[0] for r in conn.execute(_Q["job_delete_many"], {"ids": list(job_ids)})]
        return sorted(deleted)

    def job_run_now(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        return self._change_ids("job_run_now", job_ids, now)

    def job_take_back(self, job_ids: Sequence[int], now: datetime) -> list[int]:
        with self._conn() as conn:
            held = conn.execute(_Q["job_running_leases"], {"ids": list(job_ids)}).fetchall()
        finishes = [Finish(i, token, "take_back", error=TAKEN_BACK_ERROR) for i, token in held]
        return self.job_finish(finishes, now)

    def job_purge_where(self, purge: Purge, limit: int = 10_000) -> int:
        (count,) = self._delete("job_purge_where", {**_purge_params(purge), "limit": limit})
        return int(count)

    def job_purge_count(self, purge: Purge) -> int:
        with self._conn() as conn:
            row = conn.execute(_Q["job_purge_count"], _purge_params(purge)).fetchone()
        return int(row[0]) if row else 0

    def job_purge_beyond(
        self, queue: str, keep: int, states: Sequence[str], limit: int = 10_000
    ) -> int:
        params = {"queue": queue, "keep": keep, "limit": limit, "states": list(states)}
        (count,) = self._delete("job_purge_beyond", params)
        return int(count)

    def queue_delete(self, queue: str) -> None:
        self._change_none("queue_delete", {"name": queue})


def _purge_params(purge: Purge) -> dict[str, Any]:
    """The parameters of job_purge_where and job_purge_count."""
    return {
        "before": purge.finished_before,
        "states": list(purge.states),
        "queue": purge.queue,
        "by_policy": purge.by_policy,
    }
