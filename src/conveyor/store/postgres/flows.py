"""The PostgreSQL store's part of workflows: its statements (workflows.sql), run in
the caller's transaction. The rules are conveyor.store.flows'."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.job import NewJob
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

_F = load_queries("conveyor.store.postgres", "workflows.sql")
#: The statements, for the store's reads of workflows.
Q = _F


def link(
    conn: Any,
    jobs: Sequence[NewJob],
    ids: Sequence[int],
    inserted: Sequence[int],
    now: datetime,
    workflow: str | None = None,
) -> LinkPlan:
    """Record the edges of the new jobs that wait; put them in their first state."""
    links = links_of(jobs, ids, inserted, workflow)
    if not links:
        return LinkPlan()
    new_ids = {ids[p] for p in inserted}
    asked = set(outside_parents(links, new_ids))
    # Every parent is marked waited_on, this insert's own too (their finishes
    # must resolve the new edges); the states read are those of the others.
    every_parent = sorted({p for link in links for p in link.parents})
    rows = conn.execute(_F["flow_parent_states"], {"ids": every_parent}).fetchall()
    states = {i: s for i, s in rows if i in asked}
    plan = plan_links(links, states, new_ids)
    if plan.edges:
        children, parents, resolved = zip(*plan.edges, strict=True)
        written = conn.execute(
            _F["flow_edges_insert"],
            {"children": list(children), "parents": list(parents), "resolved": list(resolved)},
        )
        check_edges_written(plan.edges, written.fetchall())
    jobs_, pending, on_failure, workflows = zip(*plan.flows, strict=True)
    conn.execute(
        _F["flow_jobs_insert"],
        {
            "jobs": list(jobs_),
            "pending": list(pending),
            "on_failure": list(on_failure),
            "workflows": list(workflows),
        },
    )
    if plan.waiting:
        conn.execute(_F["flow_wait"], {"ids": plan.waiting})
    if plan.cancelled:
        _cancel(conn, plan.cancelled, now, "queued")
    return plan


def release(conn: Any, ids: Sequence[int], now: datetime | None) -> None:
    """Resolve the edges onto the jobs of ``ids`` that ended, level by level of the graph."""
    frontier = list(ids)
    while frontier:
        frontier = _settle(conn, resolve(conn, frontier).fetchall(), now)


def resolve(conn: Any, ids: Sequence[int]) -> Any:
    """Resolve the edges onto the jobs of ``ids`` that ended; the cursor of their rows
    (child, parent, resolution), to read when the caller's pipeline allows."""
    return conn.execute(_F["flow_resolve"], {"ids": list(ids)})


def release_resolved(conn: Any, rows: list[Any], now: datetime | None) -> None:
    """Go on from edges ``resolve`` resolved: their children, and theirs in turn."""
    release(conn, _settle(conn, rows, now), now)


def orphan(conn: Any, ids: Sequence[int], now: datetime | None) -> None:
    """Jobs about to be deleted before they ended: the jobs waiting for them go on."""
    rows = conn.execute(_F["flow_orphan"], {"ids": list(ids)}).fetchall()
    release(conn, _settle(conn, rows, now), now)


def _settle(conn: Any, rows: list[Any], now: datetime | None) -> list[int]:
    """Count down the children of edges resolved now (rows: child, parent, resolution);
    queue those with no parent left, cancel those a lost parent ends. Returns those cancelled."""
    if not rows:
        return []
    plan = plan_release(rows)
    down = sorted(plan.count_down.items())
    counted = conn.execute(
        _F["flow_count_down"], {"jobs": [j for j, _ in down], "counts": [n for _, n in down]}
    ).fetchall()
    ready, cancel = after_counted(plan, counted)
    if ready:
        conn.execute(_F["flow_ready"], {"ids": ready, "now": now}).fetchall()
    return _cancel(conn, cancel, now, "waiting") if cancel else []


def cancel_waiting(conn: Any, ids: Sequence[int], now: datetime) -> list[int]:
    """An operator's cancel of the waiting jobs among ``ids``; returns those cancelled."""
    return _cancel(conn, [(i, None) for i in ids], now, "waiting")


def _cancel(
    conn: Any, items: Sequence[tuple[int, str | None]], now: datetime | None, from_state: str
) -> list[int]:
    params = {
        "ids": [i for i, _ in items],
        "errors": [e for _, e in items],
        "now": now,
        "from_state": from_state,
    }
    return sorted(r[0] for r in conn.execute(_F["flow_cancel"], params).fetchall())


def waiting_counts(conn: Any) -> list[tuple[str, int]]:
    return [(q, n) for q, n in conn.execute(_F["stats_waiting"]).fetchall()]


def relatives(conn: Any, job_id: int, children: bool) -> list[tuple[Any, ...]]:
    """Rows of a job's parents (or children): the job's columns, then the
    relative's id and the edge's resolution."""
    name = "flow_children" if children else "flow_parents"
    return list(conn.execute(_F[name], {"id": job_id}).fetchall())
