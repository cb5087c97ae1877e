"""The command group: one-line errors, and commands that live in optional extras.

The dashboard and the Spark commands import heavy packages (Starlette,
PySpark). They are named here with where they live and are imported only when
run, so ``conveyor --help`` and every other command start fast and work
without those extras installed.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import click

from conveyor.errors import ConveyorError


@dataclass(frozen=True)
class LazyCommand:
    """A command imported on first use from ``module:attribute``."""

    target: str
    #: The extra that provides its requirements, for the install hint.
    extra: str
    #: Top-level packages of that extra: a missing one means the extra is not installed.
    requires: tuple[str, ...]
    #: Shown by ``--help`` without importing anything.
    short_help: str


class ConveyorGroup(click.Group):
    """Prints errors as one clear line (with --debug: the traceback too); loads lazy commands."""

    def __init__(self, *args: Any, lazy: dict[str, LazyCommand] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lazy: dict[str, LazyCommand] = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in self.lazy:
            return command
        return self._load(cmd_name, self.lazy[cmd_name])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # click's own listing would import every lazy command to read its help.
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy and name not in self.commands:
                rows.append((name, self.lazy[name].short_help))
                continue
            command = super().get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def _load(self, name: str, lazy: LazyCommand) -> click.Command:
        module_name, _, attribute = lazy.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing in lazy.requires:
                reason = (
                    f"the {name} command needs the {lazy.extra} extra: "
                    f"pip install 'conveyor[{lazy.extra}]' ({missing} is not installed)"
                )
            else:
                reason = f"the {name} command cannot be loaded from {module_name}: {exc}"
            return _unavailable(name, lazy.short_help, reason)
        command = getattr(module, attribute, None)
        if not isinstance(command, click.Command):
            reason = f"{lazy.target} is not a click command"
            return _unavailable(name, lazy.short_help, reason)
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            args = hoist_debug(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click prints these itself, as one line
        except BrokenPipeError:
            # The reader went away (``conveyor jobs list | head``): nothing to say, and
            # the interpreter's final flush of stdout must not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            click.secho(f"error: {describe(exc)}", fg="red", err=True)
            sys.exit(1)


def hoist_debug(args: list[str]) -> list[str]:
    """``--debug`` wherever it stands (``conveyor worker x:app --debug``) moved to the front.

    Only before a ``--``, after which everything is an argument.
    """
    end = args.index("--") if "--" in args else len(args)
    if "--debug" not in args[:end]:
        return args
    rest = [a for a in args[:end] if a != "--debug"]
    return ["--debug", *rest, *args[end:]]


def describe(exc: Exception) -> str:
    """One line for an error: conveyor's own say what to do; others name their type."""
    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, ConveyorError):
        text = f"{type(exc).__name__}: {text} (run with --debug for the traceback)"
    return " ".join(text.split()) if "\n" not in text else text.splitlines()[0]


def _unavailable(name: str, short_help: str, reason: str) -> click.Command:
    """A stand-in that accepts any arguments and explains why the real command is missing."""

    def run(args: tuple[str, ...]) -> None:
        click.secho(f"error: {reason}", fg="red", err=True)
        sys.exit(1)

    return click.Command(
        name,
        callback=run,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help=short_help,
        add_help_option=False,
    )
