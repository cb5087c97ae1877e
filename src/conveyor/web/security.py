"""Who may use the dashboard, and what the browser may do with its pages.

- Token: when the dashboard has one, every request must carry it, as
  ``Authorization: Bearer <token>`` (scrapers, scripts) or as the cookie that
  a visit to any page with ``?token=<token>`` sets (browsers).
- Host check: without a token the dashboard only answers to loopback host
  names, so a web page whose own host name resolves to 127.0.0.1 (DNS
  rebinding) cannot read it.
- CSRF: every form carries a token that only this process knows and that
  another site's page cannot read; a POST without it is refused, and so is a
  POST whose Origin is another site.
- Headers: a Content-Security-Policy that allows no inline script and nothing
  from elsewhere, no framing, no sniffing, and no referrer to other sites
  ("same-origin", not "no-referrer": with that, browsers send ``Origin: null``
  on the dashboard's own form posts, which the origin check must refuse).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlencode, urlsplit

from starlette.datastructures import URL
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

TOKEN_COOKIE = "conveyor_token"
CSRF_FIELD = "csrf_token"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]


def same_token(given: str | None, expected: str) -> bool:
    # compare_digest: the time taken must not tell how much of a guess was right.
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class CsrfTokens:
    """The token forms carry: random per process, so a restart voids old pages' forms."""

    def __init__(self) -> None:
        self.value = secrets.token_urlsafe(32)

    def valid(self, given: str | None) -> bool:
        return same_token(given, self.value)


class Guard(BaseHTTPMiddleware):
    """Token check, host check and security headers, in front of every route."""

    def __init__(
        self, app: ASGIApp, token: str | None, allowed_hosts: Sequence[str] | None
    ) -> None:
        super().__init__(app)
        self.token = token
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}

    async def dispatch(self, request: Request, call_next: Handler) -> Response:
        response = await self._answer(request, call_next)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _answer(self, request: Request, call_next: Handler) -> Response:
        if self.allowed_hosts is not None:
            host = (request.url.hostname or "").lower()
            if host not in self.allowed_hosts and f"[{host}]" not in self.allowed_hosts:
                return PlainTextResponse("unknown host name", status_code=400)
        if self.token is None:
            return await call_next(request)
        login = request.query_params.get("token")
        if login is not None and request.method == "GET":
            if not same_token(login, self.token):
                return PlainTextResponse("wrong token", status_code=401)
            # Trade the token in the address for a cookie, and drop it from the
            # address so it stays out of history and screenshots.
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = URL(path=request.url.path, query=urlencode(rest))
            response: Response = RedirectResponse(str(target), status_code=303)
            response.set_cookie(
                TOKEN_COOKIE,
                self.token,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
        if same_token(request.cookies.get(TOKEN_COOKIE), self.token) or same_token(
            _bearer(request), self.token
        ):
            return await call_next(request)
        return PlainTextResponse(
            "this dashboard needs its token: send 'Authorization: Bearer <token>', "
            "or open any page once with ?token=<token>",
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="conveyor"'},
        )


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value else None


def foreign_origin(request: Request) -> bool:
    """Whether a POST says it came from a page of another site."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        # Browsers send Origin on every cross-site POST; "null" comes from
        # sandboxed or privacy-stripped pages, which must not act here either.
        return origin == "null"
    return urlsplit(origin).netloc.lower() != request.url.netloc.lower()
