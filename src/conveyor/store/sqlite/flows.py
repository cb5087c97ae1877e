"""The SQLite store's part of workflows: its statements (workflows.sql), run in the
caller's write transaction. The rules are conveyor.store.flows'."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from conveyor.job import EventKind, NewJob
from conveyor.store.flows import (
    LinkPlan,
    after_counted,
    check_edges_written,
    links_of,
    outside_parents,
    plan_links,
    plan_release,
)
from conveyor.store.sql import load_queries

_F = load_queries("conveyor.store.sqlite", "workflows.sql")
#: The statements, for the store's reads of workflows.
Q = _F


def link(
    conn: sqlite3.Connection,
    jobs: Sequence[NewJob],
    ids: Sequence[int],
    inserted: Sequence[int],
    now_ts: float,
    workflow: str | None = None,
) -> LinkPlan:
    """Record the edges of the new jobs that wait; put them in their first state."""
    links = links_of(jobs, ids, inserted, workflow)
    if not links:
        return LinkPlan()
    new_ids = {ids[p] for p in inserted}
    asked = outside_parents(links, new_ids)
    states = dict(conn.execute(_F["flow_parent_states"], {"ids": json.dumps(asked)}).fetchall())
    plan = plan_links(links, states, new_ids)
    if plan.edges:
        written = conn.execute(_F["flow_edges_insert"], {"items": json.dumps(plan.edges)})
        check_edges_written(plan.edges, written.fetchall())
    conn.execute(_F["flow_jobs_insert"], {"items": json.dumps(plan.flows)})
    if plan.waiting:
        conn.execute(_F["flow_wait"], {"ids": json.dumps(plan.waiting)})
    if plan.cancelled:
        params = {"items": json.dumps(plan.cancelled), "now": now_ts}
        gone = [r[0] for r in conn.execute(_F["flow_cancel_new"], params)]
        _events(conn, EventKind.CANCELLED, gone, now_ts)
    return plan


def release(conn: sqlite3.Connection, ids: Sequence[int], now_ts: float) -> None:
    """Resolve the edges onto the jobs of ``ids`` that ended, level by level of the graph."""
    frontier = list(ids)
    while frontier:
        rows = conn.execute(_F["flow_resolve"], {"ids": json.dumps(frontier)}).fetchall()
        frontier = _settle(conn, rows, now_ts)


def orphan(conn: sqlite3.Connection, ids: Sequence[int], now_ts: float) -> None:
    """Jobs about to be deleted before they ended: the jobs waiting for them go on."""
    rows = conn.execute(_F["flow_orphan"], {"ids": json.dumps(list(ids))}).fetchall()
    release(conn, _settle(conn, rows, now_ts), now_ts)


def _settle(conn: sqlite3.Connection, rows: list[Any], now_ts: float) -> list[int]:
    """Count down the children of edges resolved now (rows: child, parent, resolution);
    queue those with no parent left, cancel those a lost parent ends. Returns those cancelled."""
    if not rows:
        return []
    plan = plan_release(rows)
    items = json.dumps(sorted(plan.count_down.items()))
    counted = conn.execute(_F["flow_count_down"], {"items": items}).fetchall()
    ready, cancel = after_counted(plan, counted)
    if ready:
        made = [r[0] for r in conn.execute(_F["flow_ready"], {"ids": json.dumps(ready)})]
        _events(conn, EventKind.READY, made, now_ts)
    if not cancel:
        return []
    params = {"items": json.dumps(cancel), "now": now_ts}
    gone = [r[0] for r in conn.execute(_F["flow_cancel"], params)]
    _events(conn, EventKind.CANCELLED, gone, now_ts)
    return gone


def cancel_waiting(conn: sqlite3.Connection, ids: Sequence[int], now_ts: float) -> list[int]:
    """An operator's cancel of the waiting jobs among ``ids``; returns those cancelled."""
    params = {"ids": json.dumps(list(ids)), "now": now_ts}
    gone = [r[0] for r in conn.execute(_F["flow_cancel_waiting"], params)]
    _events(conn, EventKind.CANCELLED, gone, now_ts)
    return gone


def keep(conn: sqlite3.Connection, ids: Sequence[int]) -> list[int]:
    """``ids`` less the jobs whose children have not ended (retention keeps them)."""
    if not ids:
        return []
    kept = {r[0] for r in conn.execute(_F["flow_keep"], {"ids": json.dumps(list(ids))})}
    return [i for i in ids if i not in kept]


def forget(conn: sqlite3.Connection, encoded_ids: str) -> None:
    """Deleted jobs' edges and flow rows; the edges onto them are kept, as deleted."""
    conn.execute(_F["flow_forget"], {"ids": encoded_ids})
    conn.execute(_F["flow_forget_parents"], {"ids": encoded_ids})
    conn.execute(_F["flow_forget_jobs"], {"ids": encoded_ids})


def _events(conn: sqlite3.Connection, kind: str, ids: list[int], now_ts: float) -> None:
    if ids:
        params = {"ids": json.dumps(sorted(ids)), "kind": kind, "now": now_ts}
        conn.execute(_F["flow_events"], params)


def waiting_counts(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    return [(q, n) for q, n in conn.execute(_F["stats_waiting"])]


def relatives(conn: sqlite3.Connection, job_id: int, children: bool) -> list[tuple[object, ...]]:
    """Rows of a job's parents (or children): the job's columns, then the
    relative's id and the edge's resolution."""
    name = "flow_children" if children else "flow_parents"
    return list(conn.execute(_F[name], {"id": job_id}))
