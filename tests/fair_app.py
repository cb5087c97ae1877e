"""The App the worker processes of test_fair.py run: ``conveyor worker fair_app:app``.

Built on first access from ``CONVEYOR_DSN``, so that the test process can import
this module (for ``build``) without that variable.
"""

from __future__ import annotations

import os
import time
from typing import Any

from conveyor import App

#: The task's name, for the jobs the test enqueues in bulk (enqueue_many).
TASK = "fair_app.work"


def build(dsn: str | None = None) -> App:
    app = App(dsn)

    @app.task(queue="shared", name=TASK)
    def work() -> None:
        time.sleep(0.002)

    return app


_app: App | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = build(os.environ["CONVEYOR_DSN"])
        return _app
    raise AttributeError(name)
