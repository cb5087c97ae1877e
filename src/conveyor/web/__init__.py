"""The dashboard: server-rendered pages over an App's store, plus /metrics and /healthz.

Needs the ``web`` extra (``pip install 'conveyor[web]'``).
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "the conveyor dashboard needs the web extra: pip install 'conveyor[web]'"
    ) from exc

from conveyor.web.server import create_app

__all__ = ["create_app"]
