"""Workflows at scale: a 10,000-node graph, a 1,000-wide fan-in, and no statement per edge."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conveyor.job import JobState, NewJob
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from conveyor.store.sqlite.store import SQLiteStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=120)


def node(queue: str, after_new: tuple[int, ...] = ()) -> NewJob:
    return NewJob(queue, "t", "[]", "{}", NOW, after_new=after_new)


def layered(queue: str, width: int, layers: int, fan: int) -> list[NewJob]:
    """Layers of ``width`` jobs, each after ``fan`` jobs of the layer before."""
    nodes = []
    for position in range(width * layers):
        layer, slot = divmod(position, width)
        parents = () if layer == 0 else tuple(
            (layer - 1) * width + (slot + k) % width for k in range(fan)
        )  # fmt: skip
        nodes.append(node(queue, parents))
    return nodes


def run_rounds(store: Store, queue: str) -> list[list[int]]:
    """Claim everything claimable and complete it, round after round; the ids of each round."""
    rounds = []
    while True:
        claimed = store.job_claim([queue], 10_000, "w", LEASE)
        if not claimed:
            return rounds
        store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed])
        rounds.append(sorted(j.id for j in claimed))


@pytest.mark.slow
def test_a_10000_node_graph_runs_layer_by_layer(store: Store) -> None:
    width, layers = 100, 100
    jobs = store.job_insert_many(layered("big", width, layers, 3), NOW)
    assert sum(j.state == JobState.WAITING for j in jobs) == width * (layers - 1)

    rounds = run_rounds(store, "big")

    # Each finish readies exactly the next layer: a hundred rounds of a hundred jobs.
    assert [len(r) for r in rounds] == [width] * layers
    assert rounds[0] == [j.id for j in jobs[:width]]
    assert rounds[-1] == [j.id for j in jobs[-width:]]


def test_a_1000_wide_fan_in_is_ready_once_the_last_parent_ends(store: Store) -> None:
    nodes = [node("fan") for _ in range(1000)]
    nodes.append(node("fan", tuple(range(1000))))
    child = store.job_insert_many(nodes, NOW)[-1]
    claimed = store.job_claim(["fan"], 1000, "w", LEASE)
    assert len(claimed) == 1000
    store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed[:999]])
    (still,) = store.job_get_many([child.id])
    assert still.state == JobState.WAITING
    store.job_finish([Finish.complete(claimed[999].id, claimed[999].lease_token or "", "1")])
    (ready,) = store.job_get_many([child.id])
    assert ready.state == JobState.QUEUED
    assert len(store.job_parents(child.id)) == 1000


def statements_to_finish(tmp_path: Path, parents: int, children: int) -> int:
    """How many statements SQLite runs to finish ``parents`` jobs each of ``children`` wait for."""
    store = SQLiteStore(tmp_path / f"count-{parents}-{children}.db")
    nodes = [node("q") for _ in range(parents)]
    nodes += [node("q", tuple(range(parents))) for _ in range(children)]
    store.job_insert_many(nodes, NOW)
    claimed = store.job_claim(["q"], parents, "w", LEASE, NOW)
    seen: list[str] = []
    conn: sqlite3.Connection = store._conn()
    conn.set_trace_callback(seen.append)
    store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed], NOW)
    conn.set_trace_callback(None)
    store.close()
    return len(seen)


def test_the_finish_runs_as_many_statements_for_ten_edges_as_for_ten_thousand(
    tmp_path: Path,
) -> None:
    few = statements_to_finish(tmp_path, parents=10, children=1)
    many = statements_to_finish(tmp_path, parents=100, children=100)
    without = statements_to_finish(tmp_path, parents=10, children=0)
    assert few == many  # 10 edges, then 10,000: the same statements, set-based
    assert without < few <= without + 6  # what edges add: a few statements per finish
