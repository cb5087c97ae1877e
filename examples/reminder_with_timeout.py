"""A reminder with a timeout: wait for the user's answer, remind them if none comes.

    python examples/reminder_with_timeout.py

- ``ctx.wait_for("answer", timeout=...)`` returns the answer if it came (sent by
  ``app.signal`` from wherever the answer arrives: a web hook, a form), or parks
  the job until it comes, holding no worker, slot or lease meanwhile.
- No answer before the timeout: ``SignalTimeout``, and the reminder goes out.
- The welcome mail is a durable step: sent once, though the handler runs again
  when the job is woken.

The timeout is a second here (days in real life), so that the example ends; the
jobs go to the store named by CONVEYOR_DSN, else to ./conveyor.db.
"""

from __future__ import annotations

from conveyor import App, Context, SignalTimeout

app = App()  # CONVEYOR_DSN, else sqlite:///conveyor.db

SENT: list[str] = []


def send(to: str, subject: str) -> str:
    SENT.append(f"{subject} -> {to}")
    return f"{subject} sent to {to}"


@app.task(queue="onboarding")
def onboard(ctx: Context, user: str, wait_seconds: float) -> str:
    ctx.step("welcome", send, user, "welcome")
    try:
        answer = ctx.wait_for("answer", timeout=wait_seconds)
    except SignalTimeout:
        return ctx.step("reminder", send, user, "reminder")
    return f"{user} answered {answer!r}: no reminder"


def main() -> None:
    ann, bo = (onboard.enqueue(user, 1.0) for user in ("ann@example.com", "bo@example.com"))
    app.signal(bo.id, "answer", "thanks!")  # bo answers (before or while the job waits)
    with app.worker(queues=["onboarding"], poll_interval=0.2):
        for job in (ann, bo):
            print(f"job {job.id}: {app.wait(job.id, timeout=30)}")
    for job in (ann, bo):
        steps = ", ".join(step.name for step in app.steps(job.id))
        print(f"job {job.id}: steps {steps}")
    print("mails: " + "; ".join(SENT))


if __name__ == "__main__":
    main()
