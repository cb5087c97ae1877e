"""An App with typed tasks, for the CLI's ``conveyor tasks`` (database from CONVEYOR_DSN)."""

from __future__ import annotations

import datetime as dt
import enum
import os
from dataclasses import dataclass

from conveyor import App

app = App(os.environ.get("CONVEYOR_DSN", "sqlite:///:memory:"))


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclass
class Order:
    id: int
    size: Size
    placed: dt.datetime


@app.task(queue="orders")
def ship(order: Order, note: str = "") -> str:
    return f"{order.id}:{order.size.value}"


@app.task
def plain(n: int) -> int:
    return n
