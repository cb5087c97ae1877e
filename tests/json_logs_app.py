"""An App for ``conveyor worker --log-format json`` tests: a job that succeeds, one that fails."""

from __future__ import annotations

import os

from conveyor import App, FixedBackoff

app = App(os.environ["CONVEYOR_DSN"])


@app.task(queue="logged")
def greet(name: str) -> str:
    return f"hello {name}"


@app.task(queue="logged", backoff=FixedBackoff(0))
def crash() -> None:
    raise RuntimeError("disk on fire")
