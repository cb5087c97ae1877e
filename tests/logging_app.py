"""An App whose module logs on import, for ``conveyor worker --log-format`` tests."""

from __future__ import annotations

import logging
import os

from conveyor import App

app = App(os.environ["CONVEYOR_DSN"])

# Logged through the standard module after the worker configured it: the line
# shows in the format the command line chose, extra fields included.
logging.getLogger("conveyor.testapp").info("tasks loaded", extra={"tasks": 1, "where": "import"})


@app.task(queue="logs")
def noop() -> None:
    return None
