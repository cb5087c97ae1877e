"""What each step of a job's life costs Redis: CPU and append-only-file bytes per job.

    python benchmarks/redis_costs.py                 # a throwaway redis-server, 10,000 jobs
    python benchmarks/redis_costs.py --jobs 20000 --rounds 3
    python benchmarks/redis_costs.py --dsn redis://127.0.0.1:6379/0   # a server of yours (FLUSHALL)

The store alone, no worker: enqueue 1,000 jobs a call, claim 100 a call,
finish 50 a call (as a worker's completer batches them), on a server with the
append-only file on (``appendfsync everysec``). Per step, redis-server's CPU
(``INFO cpu``, user + system) and the growth of its append-only file (``INFO
persistence``) divided by the jobs; then the commands the scripts ran per job
(``INFO commandstats``). With ``--rounds`` the lowest figure of each step is
kept: other work on the machine only adds.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from redis_db import redis_database  # noqa: E402

STEPS = ("enqueue", "claim", "finish")


def costs(client: Any) -> tuple[float, int]:
    cpu, persistence = client.info("cpu"), client.info("persistence")
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], int(persistence["aof_current_size"])


def one_round(dsn: str, jobs: int) -> tuple[dict[str, tuple[float, float]], dict[str, Any]]:
    import redis

    from conveyor.job import NewJob, utcnow
    from conveyor.store.records import Finish
    from conveyor.store.redis import RedisStore

    client = redis.Redis.from_url(dsn)
    client.flushall()
    store = RedisStore(dsn, migrate=True)
    now = utcnow()
    new = [NewJob(queue="q", task="t", args_json="[]", kwargs_json="{}", run_at=now)] * jobs
    claimed: list[Any] = []

    def enqueue() -> None:
        for start in range(0, jobs, 1000):
            store.job_insert_many(new[start : start + 1000], utcnow())

    def claim() -> None:
        for _ in range(0, jobs, 100):
            claimed.extend(store.job_claim(["q"], 100, "worker-1", timedelta(seconds=60)))

    def finish() -> None:
        for start in range(0, jobs, 50):
            held = claimed[start : start + 50]
            store.job_finish([Finish.complete(j.id, j.lease_token, "null") for j in held])

    client.config_resetstat()
    out: dict[str, tuple[float, float]] = {}
    for name, step in zip(STEPS, (enqueue, claim, finish), strict=True):
        cpu, aof = costs(client)
        step()
        cpu_after, aof_after = costs(client)
        out[name] = ((cpu_after - cpu) / jobs * 1e6, (aof_after - aof) / jobs)
    commands = client.info("commandstats")
    store.close()
    client.close()
    return out, commands


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dsn", default=None, help="a Redis to use (it is FLUSHALLed)")
    args = parser.parse_args()
    if args.jobs < 100 or args.rounds < 1:
        parser.error("--jobs must be at least 100 and --rounds at least 1")
    best: dict[str, tuple[float, float]] = {}
    with redis_database(args.dsn) as dsn:
        for _ in range(args.rounds):
            measured, commands = one_round(dsn, args.jobs)
            for name, (cpu, aof) in measured.items():
                best[name] = min(best.get(name, (cpu, aof)), (cpu, aof))
    print("| step | Redis CPU per job (µs) | AOF bytes per job |")
    print("|---|---:|---:|")
    for name in STEPS:
        print(f"| {name} | {best[name][0]:.1f} | {best[name][1]:,.0f} |")
    total_cpu = sum(cpu for cpu, _ in best.values())
    total_aof = sum(aof for _, aof in best.values())
    print(f"| a job's whole life | {total_cpu:.1f} | {total_aof:,.0f} |")
    print("\nCommands per job (last round), by time spent:")
    for name, row in sorted(commands.items(), key=lambda kv: -kv[1]["usec"])[:8]:
        print(f"  {name[len('cmdstat_') :]:<16} {row['calls'] / args.jobs:7.3f} calls, "
              f"{row['usec'] / args.jobs:6.2f} µs")  # fmt: skip


if __name__ == "__main__":
    main()
