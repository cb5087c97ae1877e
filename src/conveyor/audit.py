"""Recording operators' actions in the store's audit, and reading it back.

The dashboard and the CLI call ``record`` after an action changed something:
who (``actor``), from where (``source``), what, on what, and how many jobs.
The App's own methods record nothing, so a program's calls and a job's life
(enqueue, claim, finish) cost nothing here.
"""

from __future__ import annotations

import getpass
import os
import socket
from typing import TYPE_CHECKING

from conveyor.errors import ConfigurationError
from conveyor.job import utcnow
from conveyor.store.audit import AuditAction, AuditEntry, AuditStore

if TYPE_CHECKING:
    from conveyor.app import App

#: Names the CLI's actor instead of user@host (a shared account's real person, a script's name).
ACTOR_ENV = "CONVEYOR_ACTOR"


def record(
    app: App, actor: str, source: str, action: str, target: str, jobs: int | None = None
) -> None:
    """Add an entry to the store's audit; nothing on a store without one."""
    store = app.store
    if isinstance(store, AuditStore):
        store.audit_record(AuditAction(actor, source, action, target, jobs), utcnow())


def record_cli(app: App, action: str, target: str, jobs: int | None = None) -> None:
    """An action of a ``conveyor`` command, by the user running it."""
    record(app, cli_actor(), "cli", action, target, jobs)


def cli_actor() -> str:
    """$CONVEYOR_ACTOR, else user@host of the shell."""
    named = os.environ.get(ACTOR_ENV, "").strip()
    if named:
        return named
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no user name in the environment or the password file
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"{user}@{socket.gethostname()}"


def entries(app: App, limit: int = 50, before: int | None = None) -> list[AuditEntry]:
    """The audit's newest ``limit`` entries (with ids below ``before``), newest first."""
    store = app.store
    if not isinstance(store, AuditStore):
        raise ConfigurationError(f"{store.description} keeps no audit")
    if not 1 <= limit <= 10_000:
        raise ConfigurationError(f"limit must be from 1 to 10000, got {limit}")
    return store.audit_list(limit, before)
