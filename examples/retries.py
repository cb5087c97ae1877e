"""Retries and failures: what happens to a job whose handler raises.

    python examples/retries.py

- An exception is retried with the task's backoff until ``max_attempts``.
- ``raise Retry(delay)`` runs the job again later without using an attempt.
- ``raise Fail(reason)`` fails the job at once, with no more attempts.
- A job that failed for good keeps its error (the traceback); ``job.wait()``
  raises ``JobFailed`` with it, and ``app.retry(id)`` queues it again.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

from conveyor import App, Context, Fail, FixedBackoff, JobFailed, Retry

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db

#: Cards the (pretend) payment provider declines, until someone fixes them.
DECLINED = {"card-0002"}


# Short backoffs, so that the example runs in a second; the default backoff is
# exponential from 1 s, doubling, capped at an hour, with jitter.
@app.task(queue="payments", max_attempts=3, backoff=FixedBackoff(0.1))
def charge(ctx: Context, card: str, cents: int) -> str:
    if ctx.attempt < 3 and card == "card-0001":
        raise ConnectionError(f"provider unreachable (attempt {ctx.attempt})")  # retried
    if card in DECLINED:
        raise Fail(f"{card} declined")  # no point in trying again
    return f"charged {cents} cents to {card}"


@app.task(queue="payments", max_attempts=2, backoff=FixedBackoff(0.1))
def refund(order: int) -> None:
    raise ValueError(f"order {order} has no payment to refund")  # fails every attempt


#: Orders the (pretend) warehouse has packed so far.
PACKED: set[int] = set()


@app.task(queue="payments", max_attempts=1)
def ship(ctx: Context, order: int) -> str:
    if order not in PACKED:
        PACKED.add(order)  # it will be packed by the next look
        raise Retry(delay=0.1, reason="not packed yet")  # no attempt used
    return f"order {order} shipped after {ctx.attempt} attempt(s)"


def history(job_id: int) -> str:
    return ", ".join(event.kind for event in app.events(job_id))


def main() -> None:
    flaky = charge.enqueue("card-0001", 1250)
    declined = charge.enqueue("card-0002", 990)
    broken = refund.enqueue(17)
    waiting = ship.enqueue(42)

    with app.worker(queues=["payments"], concurrency=4):
        print("flaky charge:", flaky.wait(timeout=10))
        print("  history:", history(flaky.id))
        print("ship:", waiting.wait(timeout=10))
        print("  history:", history(waiting.id))
        for job in (declined, broken):
            try:
                job.wait(timeout=10)
            except JobFailed as failure:
                last_line = (failure.error or "").strip().splitlines()[-1]
                print(f"{job.task} failed: {last_line}")
            ended = app.get(job.id)
            print(f"  state {ended.state} after {ended.attempts} attempt(s)")
            print("  history:", history(job.id))

        # The provider fixed the card: an operator retries the failed job.
        DECLINED.clear()
        again = app.retry(declined.id)
        print("retried by hand:", again.wait(timeout=10))
        print("  history:", history(declined.id))


if __name__ == "__main__":
    try:
        main()
    finally:
        app.close()
