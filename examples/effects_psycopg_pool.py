"""Exactly-once effects on PostgreSQL with a psycopg connection pool.

    CONVEYOR_DSN=postgresql://localhost/app python examples/effects_psycopg_pool.py

- ``ctx.complete(conn, result=...)`` records the job's success in the
  handler's own transaction: the payment row and the job's success commit
  together, or not at all. A worker that dies before the commit leaves
  neither, and the job runs again; one that dies after leaves both, and the
  job never runs again.
- ``ctx.step(name, fn, ...)`` runs ``fn`` once for the job: a later attempt
  gets the recorded result back instead of calling it again.

The pool is the application's own (the one its web handlers use); conveyor
only needs a connection of it, to the same database as the queue.
"""

from __future__ import annotations

import logging
import os
import sys

from psycopg_pool import ConnectionPool

from conveyor import App, Context, FixedBackoff

DSN = os.environ.get("CONVEYOR_DSN", "")  # the queue and the app share the database
if not DSN.startswith(("postgresql://", "postgres://")):
    # Said at once: a pool given anything else would wait out its timeout first.
    sys.exit(
        "effects_psycopg_pool.py needs PostgreSQL: set CONVEYOR_DSN=postgresql://... "
        f"(it is {DSN.partition(':')[0] + ':...' if DSN else 'unset'})"
    )
app = App(DSN)
pool = ConnectionPool(DSN, min_size=1, max_size=4, open=False)

#: Calls the (pretend) payment provider received, to show that a step runs once.
PROVIDER_CALLS: list[str] = []


def authorize(order: int, cents: int) -> str:
    PROVIDER_CALLS.append(f"authorize {order}")
    return f"auth-{order}-{cents}"


@app.task(queue="payments", max_attempts=3, backoff=FixedBackoff(0.1))
def capture(ctx: Context, order: int, cents: int) -> None:
    # A durable step: recorded the first time, returned as recorded afterwards.
    auth = ctx.step("authorize", authorize, order, cents)
    if ctx.attempt == 1:
        raise ConnectionError("the network failed after the authorization")  # retried
    # The pool's connection commits when the block ends, and rolls back on an error.
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO payments (order_id, auth, cents) VALUES (%s, %s, %s)",
            (order, auth, cents),
        )
        ctx.complete(conn, result={"order": order, "auth": auth})


def main() -> None:
    app.migrate()
    pool.open()
    with pool.connection() as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS payments ("
            " order_id bigint PRIMARY KEY, auth text NOT NULL, cents bigint NOT NULL)"
        )
    job = capture.enqueue(7, 1250)
    with app.worker(queues=["payments"]):
        print("result:", job.wait(timeout=10))
    print("provider calls:", ", ".join(PROVIDER_CALLS))
    print("steps:", ", ".join(f"{s.name} (attempt {s.attempt})" for s in app.steps(job.id)))
    print("history:", ", ".join(event.kind for event in app.events(job.id)))
    with pool.connection() as conn:
        rows = conn.execute("SELECT order_id, auth FROM payments").fetchall()
    print("payments:", rows)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        main()
    finally:
        pool.close()
        app.close()
