"""A reminder that sleeps: the handler waits days without holding a worker.

    python examples/durable_reminder.py

- ``ctx.step`` records the welcome mail once; a later run returns its result.
- ``ctx.sleep`` ends the attempt and queues the job again for its wake time,
  recorded as a step: no worker slot, no lease, no attempt used meanwhile.
- Woken, the handler runs from the top: the mail is not sent again, the sleep
  returns at once, and the reminder goes out unless the user answered.

The sleep is a second here, so that the example ends; the jobs go to the store
named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

import datetime as dt

from conveyor import App, Context

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db

#: Mails the (pretend) mailer sent, and users who answered the welcome mail.
SENT: list[str] = []
ANSWERED = {"bo@example.com"}


def send(to: str, subject: str) -> str:
    SENT.append(f"{subject} -> {to}")
    return f"{subject} sent to {to}"


@app.task(queue="onboarding")
def onboard(ctx: Context, user: str, wait_seconds: float) -> str:
    ctx.step("welcome", send, user, "welcome")
    ctx.sleep(dt.timedelta(seconds=wait_seconds))  # days, in real life
    if user in ANSWERED:
        return f"{user} answered: no reminder"
    return ctx.step("reminder", send, user, "reminder")


def main() -> None:
    jobs = [onboard.enqueue(user, 1.0) for user in ("ann@example.com", "bo@example.com")]
    with app.worker(queues=["onboarding"], poll_interval=0.2):
        for job in jobs:
            print(f"job {job.id}: {app.wait(job.id, timeout=30)}")
    for job in jobs:
        steps = ", ".join(step.name for step in app.steps(job.id))
        print(f"job {job.id}: steps {steps}; attempts {app.get(job.id).attempts}")
    print("mails: " + "; ".join(SENT))


if __name__ == "__main__":
    main()
