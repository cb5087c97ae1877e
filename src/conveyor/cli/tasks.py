"""``conveyor tasks``: an App's registered tasks, and the JSON Schema of each one's arguments."""

from __future__ import annotations

from typing import Any

import click
from rich.text import Text

from conveyor.cli.options import json_option
from conveyor.cli.output import Col, console, fitted_table, print_json
from conveyor.cli.worker import load_app

APP_ARGUMENT = click.argument("app_path", metavar="MODULE:APP")


@click.group()
def tasks() -> None:
    """An App's tasks: their queues and the arguments they take."""


@tasks.command("list")
@APP_ARGUMENT
@json_option
def list_tasks(app_path: str, as_json: bool) -> None:
    """The tasks MODULE:APP registers, with their queue, attempts and whether they are typed."""
    app = load_app(app_path)
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "queue": task.queue,
            "max_attempts": task.max_attempts,
            "priority": task.priority,
            "typed": task.arguments is not None,
        }
        for name, task in sorted(app.tasks.items())
    ]
    if as_json:
        print_json(rows)
        return
    columns = [Col("task", ratio=2), Col("queue", ratio=1), Col("attempts", justify="right"),
               Col("priority", justify="right"), Col("typed arguments")]  # fmt: skip
    cells: list[list[str | Text]] = [
        [
            row["name"],
            row["queue"],
            str(row["max_attempts"]),
            str(row["priority"]),
            "yes" if row["typed"] else "no",
        ]
        for row in rows
    ]
    console().print(fitted_table(columns, cells))


@tasks.command("show")
@APP_ARGUMENT
@click.argument("name")
def show_task(app_path: str, name: str) -> None:
    """The JSON Schema of task NAME's arguments (for clients that build jobs elsewhere)."""
    print_json(load_app(app_path).task_schema(name))
