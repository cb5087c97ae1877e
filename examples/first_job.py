"""A first job and a worker: declare a task, enqueue it, run it, wait for its result.

    python examples/first_job.py

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db (a
SQLite file, created on first use, in the directory you run from). The worker
runs in this process, in a background thread; in production it is a process
of its own, started from the same directory so that it opens the same
database (PYTHONPATH finds the module):

    PYTHONPATH=examples conveyor worker first_job:app --queues greetings
"""

from __future__ import annotations

import logging

from conveyor import App

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db


@app.task(queue="greetings", max_attempts=3)
def greet(name: str) -> str:
    return f"Hello, {name}!"


def main() -> None:
    job = greet.enqueue("Ada")  # stored durably before enqueue returns
    print(f"enqueued job {job.id} ({job.task}) on queue {job.queue}: {job.state}")

    # Enqueueing with a key twice gives back the same job while it is waiting.
    first = greet.options(key="welcome-grace").enqueue("Grace")
    again = greet.options(key="welcome-grace").enqueue("Grace")
    print(f"keyed enqueue twice: job {first.id} and job {again.id} (existing: {again.existing})")

    with app.worker(queues=["greetings"], concurrency=2):
        print("result:", job.wait(timeout=10))
        print("keyed result:", first.wait(timeout=10))

    done = app.get(job.id)
    print(f"job {done.id} is {done.state} after {done.attempts} attempt(s)")
    print("history:", ", ".join(event.kind for event in app.events(job.id)))


if __name__ == "__main__":
    # The worker talks through the logging module: a start line, a line per job, a summary.
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        main()
    finally:
        app.close()
