"""Limits against a partner API: a rate and a concurrency that every worker obeys.

    python examples/partner_limits.py

The (pretend) partner allows 10 calls a second and 2 at once, and 5 a second
for each customer; past that it answers "429 Too Many Requests".
Limits stored with ``app.limit`` hold for every worker process at once, from
their next claim: the workers start no more jobs than the partner allows.
When the partner still says 429 (its own quota for a customer ran out), the
handler raises ``ctx.throttle(seconds)``: every worker holds that customer's
jobs back for that long, and the job runs again after it without using an
attempt.

A rate counts the jobs started when a worker claims them; the partner counts
calls when they reach it, a few milliseconds later. Two starts a second apart
can arrive a little closer together, so the limits leave a margin below the
partner's: 7 a second against its 10, and 3 per customer against its 5.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from conveyor import App, Context

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db


@dataclass
class Partner:
    """A pretend partner API that counts what it was asked, and when."""

    calls: list[tuple[float, str]] = field(default_factory=list)  # (when, customer)
    running: int = 0
    most_at_once: int = 0
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, customer: str, cents: int) -> int:
        with self.lock:
            if customer == "cust-3" and "cust-3" not in self.refused:
                self.refused.append(customer)  # its daily quota, say: come back in 1 s
                return 429
            self.calls.append((time.monotonic(), customer))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.05)  # the call itself
        with self.lock:
            self.running -= 1
        return 200

    def most_in_one_second(self, customer: str | None = None) -> int:
        times = [t for t, who in self.calls if customer in (None, who)]
        return max(sum(1 for t in times if start <= t < start + 1) for start in times)


partner = Partner()


@app.task(queue="partner", max_attempts=5)
def charge(ctx: Context, customer: str, cents: int) -> str:
    status = partner.charge(customer, cents)
    if status == 429:
        raise ctx.throttle(1)  # hold this customer's jobs back for 1 s, everywhere
    return f"{customer}: {cents} cents"


def main() -> None:
    app.limit("partner", rate="7/s", concurrency=2)  # within the partner's limits, fleet-wide
    app.limit("partner", rate="3/s", per_key=True)  # and each customer's (its limit_key)
    jobs = [
        charge.options(limit_key=f"cust-{i % 3 + 1}").enqueue(f"cust-{i % 3 + 1}", 100 + i)
        for i in range(20)
    ]
    status = app.limits()["partner"]
    print(f"limits: {status.limit}; per customer: {status.key_limit}; ready: {status.ready}")

    started = time.monotonic()
    with app.worker(queues=["partner"], concurrency=8):
        for job in jobs:
            job.wait(timeout=60)
    took = time.monotonic() - started

    print(f"{len(partner.calls)} calls in {took:.1f}s")
    print(f"most calls at once: {partner.most_at_once} (the partner allows 2)")
    print(f"most calls in one second: {partner.most_in_one_second()} (the partner allows 10)")
    busiest = max(partner.most_in_one_second(f"cust-{n}") for n in (1, 2, 3))
    print(f"most calls of one customer in one second: {busiest} (the partner allows 5)")
    print(f"answered 429: {len(partner.refused)} time(s), for {', '.join(partner.refused)}")
    attempts = max(app.get(job.id).attempts for job in jobs)
    print(f"attempts used per job: at most {attempts}")
    app.limit("partner", clear=True)  # clear the limits (per_key=True clears the customers')
    app.limit("partner", clear=True, per_key=True)


if __name__ == "__main__":
    try:
        main()
    finally:
        app.close()
