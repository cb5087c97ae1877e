"""A host application with its own login, and the dashboard mounted inside it.

Its authentication is Starlette's AuthenticationMiddleware with a backend that
reads the host's own cookie, set by its /login page: the dashboard sees the
host's user in the ASGI scope, as it would inside any Starlette or FastAPI app.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from dashboard_server import free_port

MOUNT = "/ops/queue"
HOST_COOKIE = "host_user"


class CookieLogin(AuthenticationBackend):
    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        user = conn.cookies.get(HOST_COOKIE)
        if not user:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(user)


async def login(request: Request) -> Response:
    response = RedirectResponse(request.query_params.get("next", "/"), status_code=303)
    response.set_cookie(HOST_COOKIE, request.query_params["user"], httponly=True)
    return response


async def home(request: Request) -> Response:
    return PlainTextResponse(f"host home of {request.user.display_name or 'nobody'}")


def host_app(dashboard: ASGIApp) -> Starlette:
    return Starlette(
        routes=[
            Route("/", home),
            Route("/login", login),
            Mount(MOUNT, app=dashboard),
        ],
        middleware=[Middleware(AuthenticationMiddleware, backend=CookieLogin())],
    )


@contextmanager
def serve_asgi(asgi: ASGIApp) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free loopback port until the block ends."""
    port = free_port()
    config = uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="host-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the host application did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
