"""Fan out, then merge: one child job per page, and a parent that adds them up.

    python examples/fan_out_merge.py

- ``ctx.spawn(task, ...)`` enqueues a child once: its id is recorded as a step,
  and its key (``spawn:<parent id>:<n>``) finds the same child again after a
  crash, so no page is counted twice.
- ``ctx.wait(children)`` parks the parent until every child has ended, then
  returns their results in order (``ChildFailed`` names those that failed).
- The children run on any worker meanwhile; the parent holds no slot.

The jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

from conveyor import App, Context

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db

PAGES = {1: "the quick brown fox", 2: "jumps over", 3: "the lazy dog"}


@app.task(queue="pages")
def count_words(page: int) -> int:
    return len(PAGES[page].split())


@app.task(queue="reports")
def word_count(ctx: Context, pages: list[int]) -> int:
    children = [ctx.spawn(count_words, page) for page in pages]
    return sum(ctx.wait(children))


def main() -> None:
    job = word_count.enqueue(sorted(PAGES))
    with app.worker(queues=["reports", "pages"], concurrency=4, poll_interval=0.1):
        print(f"job {job.id}: {app.wait(job.id, timeout=30)} words")
    steps = ", ".join(step.name for step in app.steps(job.id))
    print(f"job {job.id}: steps {steps}")
    print(f"children: {app.count_jobs(queue='pages')}")


if __name__ == "__main__":
    main()
