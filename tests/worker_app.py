"""An App for tests that start ``conveyor worker`` in a subprocess (database from CONVEYOR_DSN)."""

from __future__ import annotations

import os

from conveyor import App

app = App(os.environ["CONVEYOR_DSN"])


@app.task(queue="cli")
def double(n: int) -> int:
    return n * 2


not_an_app = "just a string"
