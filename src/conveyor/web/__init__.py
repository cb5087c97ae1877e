"""The dashboard: server-rendered pages over an App's store, plus /metrics and /healthz.

Needs the ``web`` extra (``pip install 'conveyor[web]'``). Importing this
package does not need it (``conveyor.web.commands`` can be attached to a CLI
that lacks it); calling ``create_app`` does, and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from conveyor.app import App

__all__ = ["create_app", "require_web_extra"]


def require_web_extra() -> None:
    """Raise ImportError with the install hint when starlette, jinja2 or uvicorn is missing."""
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the conveyor dashboard needs the web extra: pip install 'conveyor[web]' ({exc})"
        ) from exc


def create_app(
    app: App,
    token: str | None = None,
    *,
    read_token: str | None = None,
    user_header: str | None = None,
    roles: Mapping[str, str] | Callable[[str], str | None] | None = None,
    secret: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application (see conveyor.web.server.create_app)."""
    require_web_extra()
    from conveyor.web.server import create_app as create

    return create(
        app,
        token,
        read_token=read_token,
        user_header=user_header,
        roles=roles,
        secret=secret,
        allowed_hosts=allowed_hosts,
    )
