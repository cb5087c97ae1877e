"""The App the worker processes of test_limits_fleet.py run: ``conveyor worker limits_app:app``.

``limits_app:app`` is built on first access from ``CONVEYOR_DSN``, so the test
process can import this module (for ``build``) without that variable. Handlers
return when they ran, on the machine's wall clock (one clock for every process
of the machine), so the tests can see which ran at the same time.
"""

from __future__ import annotations

import os
import time
from typing import Any

from conveyor import App


def build(dsn: str | None = None) -> App:
    app = App(dsn)

    @app.task(queue="paced")
    def tick() -> float:
        return time.time()

    @app.task(queue="capped")
    def hold(seconds: float) -> list[float]:
        begun = time.time()
        time.sleep(seconds)
        return [begun, time.time()]

    return app


_app: App | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = build(os.environ["CONVEYOR_DSN"])
        return _app
    raise AttributeError(name)
