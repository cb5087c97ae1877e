"""``conveyor dashboard``: serve the dashboard with uvicorn.

A standalone click command, so the ``conveyor`` group can attach it lazily
and a CLI without the web extra still starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.decorators import FC

from conveyor.cli.options import dsn_option
from conveyor.errors import ConveyorError, StoreUnavailableError
from conveyor.store.dsn import DSN_ENV, default_dsn, redacted, require_existing
from conveyor.web import require_web_extra
from conveyor.web.hosts import LOOPBACK_NAMES, is_loopback

if TYPE_CHECKING:
    from conveyor.app import App

TOKEN_ENV = "CONVEYOR_DASHBOARD_TOKEN"
READ_TOKEN_ENV = "CONVEYOR_DASHBOARD_READ_TOKEN"
SECRET_ENV = "CONVEYOR_DASHBOARD_SECRET"


def _secret_option(flag: str, env: str, help_text: str) -> Callable[[FC], FC]:
    """An option read from ``env`` when not given, so a secret need not stand on the
    command line (where any user of the machine can read it)."""
    return click.option(flag, envvar=env, default=None, help=help_text)


@click.command("dashboard")
@dsn_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@_secret_option(
    "--token",
    TOKEN_ENV,
    f"Require this token on every request (also ${TOKEN_ENV}); "
    "needed to listen on anything but loopback.",
)
@_secret_option(
    "--read-token",
    READ_TOKEN_ENV,
    f"A second token, for read-only access: every action refused (also ${READ_TOKEN_ENV}).",
)
@click.option(
    "--trust-user-header",
    "user_header",
    metavar="HEADER",
    default=None,
    help="Take the user's name from this header, set by a reverse proxy in front "
    "(e.g. X-Forwarded-User). Only when nothing else can reach the dashboard.",
)
@click.option(
    "--role",
    "role_pairs",
    metavar="USER=ROLE",
    multiple=True,
    help="A user's role, admin or read (repeat; '*=read' for everyone else). "
    "Without any, every user the header names is an admin.",
)
@_secret_option(
    "--secret",
    SECRET_ENV,
    f"Key that signs session cookies (also ${SECRET_ENV}; default: from the tokens).",
)
@click.option(
    "--app",
    "app_path",
    metavar="MODULE:APP",
    default=None,
    help="Your App (imported with --dsn in $CONVEYOR_DSN): shows its periodic schedules.",
)
def dashboard(
    dsn: str | None,
    host: str,
    port: int,
    token: str | None,
    read_token: str | None,
    user_header: str | None,
    role_pairs: tuple[str, ...],
    secret: str | None,
    app_path: str | None,
) -> None:
    """Serve the web dashboard (overview, jobs, workers, actions, /metrics, /healthz)."""
    try:
        require_web_extra()
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    import uvicorn

    from conveyor.web.security import AccessRules
    from conveyor.web.server import create_app, create_app_opening

    token, read_token = token or None, read_token or None
    roles = role_map(role_pairs)
    if role_pairs and not user_header:
        raise click.UsageError("--role maps the users --trust-user-header names: give it too")
    if token is None and read_token is None and user_header is None and not is_loopback(host):
        raise click.UsageError(
            f"refusing to listen on {host} without a token: anyone who can reach it could "
            f"read and retry jobs. Pass --token or set {TOKEN_ENV} (or listen on 127.0.0.1)."
        )
    access: dict[str, Any] = {
        "read_token": read_token,
        "user_header": user_header,
        "roles": roles,
        "secret": secret or None,
    }
    try:
        rules = AccessRules(token, **access)  # refused at once, before the store is opened
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    guarded = token is not None or any(v is not None for v in access.values())
    if dsn is None:
        dsn = default_dsn()
    # Without a token the pages are open to this machine only; answering just the
    # loopback names (and the address given) keeps a foreign site from reaching
    # them through DNS rebinding.
    allowed = None if guarded else [*LOOPBACK_NAMES, host]
    opened: list[App] = []
    try:
        # Never an empty database where a typo points: the file must exist.
        require_existing(dsn)
        opened.append(_open(dsn, app_path))
    except StoreUnavailableError as exc:
        # Served anyway: every page says the store is away and retries, until it answers.
        click.secho(f"warning: {exc}; serving, and trying again", fg="yellow", err=True)
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    if opened:
        app = opened[0]
        try:
            app.check_schema()
        except ConveyorError as exc:
            # Served anyway: every page says so, and /healthz answers 503, until it is done.
            click.secho(f"warning: {exc}", fg="yellow", err=True)
        web = create_app(app, token, allowed_hosts=allowed, **access)
        described = app.description
    else:

        def opener() -> App:
            opened.append(_open(dsn, app_path))
            return opened[-1]

        described = redacted(dsn)
        web = create_app_opening(opener, described, rules, allowed)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"conveyor dashboard on http://{shown}:{port}/ ({described})")
    try:
        uvicorn.run(web, host=host, port=port, log_level="warning", server_header=False)
    finally:
        for app in opened:
            app.close()


def role_map(pairs: tuple[str, ...]) -> dict[str, str] | None:
    """``USER=ROLE`` options as a mapping; None when there are none."""
    roles: dict[str, str] = {}
    for pair in pairs:
        user, sep, role = pair.rpartition("=")
        if not sep or not user or role not in ("admin", "read"):
            raise click.BadParameter(
                f"give USER=admin or USER=read, got {pair!r}", param_hint="--role"
            )
        roles[user] = role
    return roles or None


def _open(dsn: str, app_path: str | None) -> App:
    """An App on the database; with ``app_path``, knowing that App's tasks and schedules.

    As ``enqueue --app`` does: the application's module is imported with the DSN
    in $CONVEYOR_DSN, its registry is copied, and its own App is closed.
    """
    from conveyor.app import App

    # A page waits this long at most for a store that went away (then every page says
    # so at once until the next try): the drivers' defaults are 10 and 30 s.
    timeouts: dict[str, Any] = (
        {"busy_timeout": 5.0} if dsn.startswith("sqlite:") else {"connect_timeout": 5.0}
    )
    app = App(dsn, **timeouts)
    if app_path is not None:
        from conveyor.cli.worker import load_app

        os.environ[DSN_ENV] = dsn
        loaded = load_app(app_path)
        app.tasks.update(loaded.tasks)
        app.periodic_tasks.extend(loaded.periodic_tasks)
        loaded.close()
    return app
