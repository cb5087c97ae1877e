"""The App the worker processes of test_workflows_crash.py run: ``conveyor worker flows_app:app``.

Built on first access from ``CONVEYOR_DSN``, so the test process can import the
module for its tasks without that variable.
"""

from __future__ import annotations

import os
import time
from typing import Any

from conveyor import App, Context

_app: App | None = None


def build(dsn: str) -> App:
    app = App(dsn)

    @app.task(name="hang", max_attempts=2)
    def hang(ctx: Context) -> str:
        if ctx.attempt == 1:
            time.sleep(60)  # its worker is killed long before
        return f"attempt {ctx.attempt}"

    @app.task(name="quick")
    def quick() -> str:
        return "quick"

    @app.task(name="join")
    def join(ctx: Context) -> dict[str, Any]:
        return {str(k): v for k, v in ctx.upstream.items()}

    return app


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = build(os.environ["CONVEYOR_DSN"])
        return _app
    raise AttributeError(name)
