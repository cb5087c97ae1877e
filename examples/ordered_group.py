"""An ordered group: the jobs of one account run one at a time, in the order enqueued.

    python examples/ordered_group.py

Each account's ledger entries must be applied in order, but different
accounts may go in parallel: give each job ``group=<the account>``. A worker
with eight slots then runs at most one job per account at a time, oldest
first, and the accounts side by side. The order holds through retries: a job
waiting for its retry holds back the later jobs of its group.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import random
import threading
import time

from conveyor import App, Context, FixedBackoff

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db

#: What each account's handler saw, in the order it ran (this process's memory).
applied: dict[str, list[int]] = {}
applied_lock = threading.Lock()


@app.task(queue="ledger", max_attempts=3, backoff=FixedBackoff(0.1))
def apply_entry(ctx: Context, account: str, entry: int) -> int:
    time.sleep(random.uniform(0.001, 0.02))  # some work of varying length
    if account == "acct-b" and entry == 2 and ctx.attempt == 1:
        raise ConnectionError("ledger database busy")  # retried; acct-b waits for it
    with applied_lock:
        applied.setdefault(account, []).append(entry)
    return entry


def main() -> None:
    accounts = ["acct-a", "acct-b", "acct-c"]
    jobs = []
    for entry in range(1, 6):  # interleaved: a1 b1 c1 a2 b2 c2 ...
        for account in accounts:
            jobs.append(apply_entry.options(group=account).enqueue(account, entry))

    with app.worker(queues=["ledger"], concurrency=8):
        for job in jobs:
            job.wait(timeout=20)

    for account in accounts:
        print(f"{account}: entries applied in order {applied[account]}")
    retried = [job for job in (app.get(j.id) for j in jobs) if job.attempts > 1]
    print(
        "retried:",
        ", ".join(f"job {job.id} ({job.group}, attempts {job.attempts})" for job in retried),
    )
    print("the group's counts:", app.count_jobs(group="acct-b"))


if __name__ == "__main__":
    try:
        main()
    finally:
        app.close()
