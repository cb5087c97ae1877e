"""crash_app's durable handlers: a sleep, a signal waited for, a child spawned and waited for,
steps on either side; each run of a step or child leaves a row in ``runs``
(name, the attempt that ran it), so the crash tests see what ran how often."""

from __future__ import annotations

import time

from conveyor import App, Context


def register_durable(app: App, write: object) -> App:
    """The tasks; ``write(sql, params)`` writes a trace row (crash_app's ``_write``)."""

    def trace(job_id: int, name: str, attempt: int) -> None:
        write(  # type: ignore[operator]
            "INSERT INTO runs (job_id, name, phase, at) VALUES (%s, %s, %s, %s)",
            (job_id, name, str(attempt), time.monotonic()),
        )

    @app.task(max_attempts=50)
    def durable_child(ctx: Context, pause: float) -> int:
        trace(ctx.job_id, "child", ctx.attempt)
        time.sleep(pause)
        return 7

    @app.task(max_attempts=50)
    def durable_flow(ctx: Context, pause: float) -> list[object]:
        def run(name: str) -> str:
            trace(ctx.job_id, name, ctx.attempt)
            time.sleep(pause)
            return name

        ctx.step("before", run, "before")
        ctx.sleep(pause)  # parked a moment: a kill may land before, during or after
        payload = ctx.wait_for("go", timeout=600)
        kid = ctx.spawn(durable_child, pause)
        results = ctx.wait([kid])
        ctx.step("after", run, "after")
        return [payload, results]

    return app
