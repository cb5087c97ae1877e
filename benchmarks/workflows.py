"""What edges cost: jobs that wait for other jobs beside jobs without edges, in one run.

    python benchmarks/workflows.py                  # every backend (starts PostgreSQL, Redis)
    python benchmarks/workflows.py --backend sqlite --rounds 3

Each round, on a fresh queue of the same database, in turns:

- plain: ``--jobs`` jobs without edges, enqueued ``BATCH`` at a time, then run
  by a claim-100-then-complete loop until none is left;
- graph: the same number of jobs as one graph enqueued at once (layers of
  ``--width`` jobs, each job after ``--fan`` jobs of the layer before), run by
  the same loop: each layer's finish readies the next;
- fan-in: ``--width * 10`` parents and one child after all of them, the parents
  run by the same loop; the child's readiness is checked.

Each round starts with another of the three kinds (the database grows as the
rounds go on). Reported: microseconds per job to enqueue and to run, each kind beside plain,
and what an edge adds (the difference over the edges), medians of the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from conveyor.job import JobState, NewJob
from conveyor.store.dsn import open_store
from conveyor.store.protocols import Store
from conveyor.store.records import Finish
from pg import postgres
from redis_db import redis_database

BATCH = 1000
CLAIM = 100
NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=120)


@dataclass
class Round:
    enqueue_s: float
    run_s: float
    jobs: int
    edges: int


def new(queue: str, after_new: tuple[int, ...] = (), after: tuple[int, ...] = ()) -> NewJob:
    return NewJob(queue, "t", "[]", "{}", NOW, after_new=after_new, after=after)


def run_all(store: Store, queue: str, expected: int) -> float:
    """Claim CLAIM at a time and complete them until ``expected`` jobs ran; seconds taken."""
    done = 0
    start = time.perf_counter()
    while done < expected:
        claimed = store.job_claim([queue], CLAIM, "bench", LEASE)
        if not claimed:
            raise RuntimeError(f"{queue}: nothing to claim after {done} of {expected} jobs")
        store.job_finish([Finish.complete(j.id, j.lease_token or "", "1") for j in claimed])
        done += len(claimed)
    return time.perf_counter() - start


def plain(store: Store, queue: str, jobs: int) -> Round:
    start = time.perf_counter()
    for first in range(0, jobs, BATCH):
        store.job_insert_many([new(queue) for _ in range(min(BATCH, jobs - first))], NOW)
    enqueue = time.perf_counter() - start
    return Round(enqueue, run_all(store, queue, jobs), jobs, 0)


def graph(store: Store, queue: str, jobs: int, width: int, fan: int) -> Round:
    nodes: list[NewJob] = []
    edges = 0
    for position in range(jobs):
        layer, slot = divmod(position, width)
        if layer == 0:
            nodes.append(new(queue))
            continue
        base = (layer - 1) * width
        parents = tuple(dict.fromkeys(base + (slot + k) % width for k in range(fan)))
        edges += len(parents)
        nodes.append(new(queue, after_new=parents))
    start = time.perf_counter()
    inserted = store.job_insert_many(nodes, NOW)
    enqueue = time.perf_counter() - start
    waiting = sum(1 for j in inserted if j.state == JobState.WAITING)
    assert waiting == jobs - width, (waiting, jobs - width)
    return Round(enqueue, run_all(store, queue, jobs), jobs, edges)


def fan_in(store: Store, queue: str, parents: int) -> Round:
    nodes = [new(queue) for _ in range(parents)]
    nodes.append(new(queue, after_new=tuple(range(parents))))
    start = time.perf_counter()
    inserted = store.job_insert_many(nodes, NOW)
    enqueue = time.perf_counter() - start
    ran = run_all(store, queue, parents)
    (child,) = store.job_get_many([inserted[-1].id])
    assert child.state == JobState.QUEUED, child.state
    return Round(enqueue, ran, parents, parents)


@contextmanager
def database(backend: str, pg_dsn: str | None, redis_dsn: str | None) -> Iterator[Store]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            store = open_store(f"sqlite:///{Path(folder) / 'bench.db'}")
            store.migrate()
            try:
                yield store
            finally:
                store.close()
        return
    maker = postgres(pg_dsn) if backend == "postgres" else redis_database(redis_dsn)
    with maker as dsn:
        store = open_store(dsn)
        store.migrate()
        try:
            yield store
        finally:
            store.close()


def per_job_us(rounds: list[Round], part: str) -> float:
    return statistics.median(getattr(r, part) / r.jobs * 1e6 for r in rounds)


def bench(backend: str, args: argparse.Namespace) -> None:
    results: dict[str, list[Round]] = {"plain": [], "graph": [], "fan-in": []}
    with database(backend, args.pg_dsn, args.redis_dsn) as store:
        kinds = {
            "plain": lambda q: plain(store, q, args.jobs),
            "graph": lambda q: graph(store, q, args.jobs, args.width, args.fan),
            "fan-in": lambda q: fan_in(store, q, args.width * 10),
        }
        order = list(kinds)
        for n in range(args.rounds):
            # Each round starts with another kind: the database grows as rounds go
            # on, and no kind should always run on the bigger one.
            for kind in order[n % 3 :] + order[: n % 3]:
                results[kind].append(kinds[kind](f"{kind}{n}"))
    base_enqueue, base_run = (
        per_job_us(results["plain"], "enqueue_s"),
        per_job_us(results["plain"], "run_s"),
    )
    print(f"\n{backend}: {args.jobs:,} jobs a round, {args.rounds} rounds (medians)")
    print("| kind | jobs | edges | enqueue µs/job | run µs/job | enqueue µs/edge | run µs/edge |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, rounds in results.items():
        enqueue, run = per_job_us(rounds, "enqueue_s"), per_job_us(rounds, "run_s")
        jobs, edges = rounds[0].jobs, rounds[0].edges
        if edges:
            extra_enqueue = f"{(enqueue - base_enqueue) * jobs / edges:.1f}"
            extra_run = f"{(run - base_run) * jobs / edges:.1f}"
        else:
            extra_enqueue = extra_run = "-"
        cells = [kind, f"{jobs:,}", f"{edges:,}", f"{enqueue:.1f}", f"{run:.1f}"]
        print("| " + " | ".join([*cells, extra_enqueue, extra_run]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "redis", "all"], default="all")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--fan", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pg-dsn")
    parser.add_argument("--redis-dsn")
    args = parser.parse_args()
    backends = ["sqlite", "postgres", "redis"] if args.backend == "all" else [args.backend]
    for backend in backends:
        bench(backend, args)


if __name__ == "__main__":
    main()
