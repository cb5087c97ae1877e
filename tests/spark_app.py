"""An App whose tasks a Spark write learns through ``.option("app", "tests.spark_app:app")``.

``App()`` without a DSN: the writer sets ``$CONVEYOR_DSN`` to the write's own
DSN while it imports this module, as ``conveyor worker --dsn`` does.
"""

from __future__ import annotations

from typing import Any

from conveyor import App, Context

app = App()


@app.task(queue="images", max_attempts=1, priority=7)
def resize(image_id: int, size: int) -> str:
    return f"{image_id}@{size}"


@app.task
def square(item_id: int, x: int) -> int:
    return x * x


@app.task(queue="mail", max_attempts=5)
def notify(ctx: Context, user: str, **extra: Any) -> None:
    return None


@app.task
def add(a: int, b: int = 0) -> int:
    return a + b
