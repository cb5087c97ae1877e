"""A payment callback: charge, wait for the provider to call back, then ship.

    python examples/payment_callback.py

- The charge is a durable step: created once, however often the handler runs.
- ``ctx.wait_for("payment")`` parks the order until the provider's callback
  arrives; the web hook that receives it calls ``app.signal(job_id, "payment",
  payload)``, which makes the parked job due at once. A callback that comes
  before the handler waits is kept for it.
- Each callback is taken once, and recorded as a step: a replay ships with the
  same payment.

Here a thread plays the provider and calls back after half a second; the jobs
go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import threading
import time

from conveyor import App, Context

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db


def create_charge(order: str, cents: int) -> str:
    return f"ch_{order}_{cents}"


@app.task(queue="orders")
def checkout(ctx: Context, order: str, cents: int) -> str:
    charge = ctx.step("charge", create_charge, order, cents)
    payment = ctx.wait_for("payment", timeout=3600)
    if payment["status"] != "paid":
        return f"order {order}: payment {payment['status']}, not shipped"
    return ctx.step("ship", lambda: f"order {order} shipped (charge {charge})")


def provider_calls_back(job_id: int, status: str) -> None:
    """The payment provider's web hook, as the web app would handle it."""
    time.sleep(0.5)
    app.signal(job_id, "payment", {"status": status})


def main() -> None:
    paid = checkout.enqueue("A1", 1200)
    declined = checkout.enqueue("B2", 500)
    callbacks = [
        threading.Thread(target=provider_calls_back, args=(paid.id, "paid")),
        threading.Thread(target=provider_calls_back, args=(declined.id, "declined")),
    ]
    with app.worker(queues=["orders"], poll_interval=0.2):
        for thread in callbacks:
            thread.start()
        for job in (paid, declined):
            print(f"job {job.id}: {app.wait(job.id, timeout=30)}")
    for thread in callbacks:
        thread.join()
    for job in (paid, declined):
        steps = ", ".join(step.name for step in app.steps(job.id))
        print(f"job {job.id}: steps {steps}")


if __name__ == "__main__":
    main()
