"""Who may use the dashboard, in which role, and what the browser may do with its pages.

- Roles: ``admin`` sees everything and acts; ``read`` sees everything and
  every state-changing request (any POST) is refused with 403, while the pages
  hide their action buttons.
- Who someone is, in this order:
  1. the host application's user: mounted inside a Starlette or FastAPI
     application whose AuthenticationMiddleware put an authenticated ``user``
     in the ASGI scope;
  2. a header a trusted reverse proxy sets (``user_header``, such as
     ``X-Forwarded-User``): only when configured, and only safe when nothing
     but that proxy can reach the dashboard;
  3. a token: the admin ``token`` or the ``read_token``, as
     ``Authorization: Bearer <token>`` (scrapers, scripts) or traded once, by
     opening any page with ``?token=<token>``, for a session cookie (browsers).
  A user's role comes from ``roles``: a mapping of user names to roles (the
  name ``"*"`` for everyone else) or a callable (``None`` for "not allowed").
  Without ``roles`` every identified user is an admin: the host's login or the
  proxy is then the gate.
- Session cookie: signed with HMAC-SHA256 (a key from ``secret``, else from
  the tokens), it holds the role, the name and when it ends; never a token.
  Changing a token or the secret ends every session.
- ``/healthz`` is open: load balancers and orchestrators ask it without a token.
- Host check: without any way to tell who is asking, the dashboard only
  answers to loopback host names, so a web page whose own host name resolves
  to 127.0.0.1 (DNS rebinding) cannot read it.
- CSRF: every form carries a token that only this process knows and that
  another site's page cannot read; a POST without it is refused, and so is a
  POST whose Origin is another site.
- Headers: a Content-Security-Policy that allows no inline script and nothing
  from elsewhere, no framing, no sniffing, and no referrer to other sites
  ("same-origin", not "no-referrer": with that, browsers send ``Origin: null``
  on the dashboard's own form posts, which the origin check must refuse).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from starlette.datastructures import URL
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp

SESSION_COOKIE = "conveyor_session"
CSRF_FIELD = "csrf_token"
ADMIN = "admin"
READ = "read"
ROLES = (ADMIN, READ)
#: Seconds a session cookie is good for; then the token is asked again.
SESSION_SECONDS = 12 * 3600
#: Where the ASGI scope carries who is asking (an Access) to the routes.
SCOPE_KEY = "conveyor.access"
#: Paths answered without asking who is asking.
OPEN_PATHS = frozenset({"/healthz"})

#: A mapping of user names to roles ("*" for the rest), or a callable of a name.
RoleMap = Mapping[str, str] | Callable[[str], str | None]

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


@dataclass(frozen=True, slots=True)
class Access:
    """Who is asking (as the audit names them) and in which role."""

    who: str
    role: str

    @property
    def can_act(self) -> bool:
        return self.role == ADMIN


#: Whoever reaches a dashboard that has no way to tell (no token, no users): loopback only.
LOCAL = Access("local", ADMIN)


def access_of(request: Request) -> Access:
    """Who is asking, as the Guard found them."""
    found = request.scope.get(SCOPE_KEY)
    return found if isinstance(found, Access) else LOCAL


def same_token(given: str | None, expected: str) -> bool:
    # compare_digest: the time taken must not tell how much of a guess was right.
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def check_role(role: object, where: str) -> str:
    if role not in ROLES:
        raise ValueError(f"{where}: a role is 'admin' or 'read', got {role!r}")
    return str(role)


@dataclass(frozen=True)
class AccessRules:
    """How the dashboard tells who is asking (see the module's docstring)."""

    token: str | None = None
    read_token: str | None = None
    user_header: str | None = None
    roles: RoleMap | None = None
    secret: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None and self.token == self.read_token:
            raise ValueError("the read token must differ from the admin token")
        if isinstance(self.roles, Mapping):
            for user, role in self.roles.items():
                check_role(role, f"roles[{user!r}]")

    @property
    def guarded(self) -> bool:
        """Whether anyone must say who they are (else: loopback only, as admin)."""
        return bool(self.token or self.read_token or self.user_header or self.roles is not None)

    def role_of(self, user: str) -> str | None:
        """The role of an identified user; None when not allowed."""
        if self.roles is None:
            return ADMIN
        if isinstance(self.roles, Mapping):
            role = self.roles.get(user, self.roles.get("*"))
        else:
            role = self.roles(user)
        return None if role is None else check_role(role, f"the role of {user!r}")

    def token_role(self, given: str | None) -> str | None:
        if given is None:
            return None
        if self.token and same_token(given, self.token):
            return ADMIN
        if self.read_token and same_token(given, self.read_token):
            return READ
        return None


class Sessions:
    """Signed session cookies: ``payload.signature``, the payload base64 JSON."""

    def __init__(self, rules: AccessRules) -> None:
        # The key: from the secret, else from the tokens (a restart keeps sessions;
        # changing a token ends them); random when there is neither.
        material = (
            rules.secret
            or "\0".join(t for t in (rules.token, rules.read_token) if t)
            or secrets.token_hex(32)
        )
        self._key = hashlib.sha256(b"conveyor-session\0" + material.encode()).digest()

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()

    def issue(self, access: Access, now: float | None = None) -> str:
        ends = int((now or time.time()) + SESSION_SECONDS)
        body = json.dumps({"w": access.who, "r": access.role, "e": ends}).encode()
        payload = base64.urlsafe_b64encode(body)
        return f"{payload.decode()}.{self._sign(payload)}"

    def read(self, cookie: str | None, now: float | None = None) -> Access | None:
        if not cookie or "." not in cookie or len(cookie) > 4096:
            return None
        payload, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(payload.encode()).encode()):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload.encode()))
            who, role, ends = str(data["w"]), data["r"], int(data["e"])
        except (ValueError, KeyError, TypeError):
            return None
        if ends < (now or time.time()) or role not in ROLES:
            return None
        return Access(who, role)


class CsrfTokens:
    """The token forms carry: random per process, so a restart voids old pages' forms."""

    def __init__(self) -> None:
        self.value = secrets.token_urlsafe(32)

    def valid(self, given: str | None) -> bool:
        return same_token(given, self.value)


class Guard(BaseHTTPMiddleware):
    """Who is asking, the host check and security headers, in front of every route."""

    def __init__(
        self, app: ASGIApp, rules: AccessRules, allowed_hosts: Sequence[str] | None
    ) -> None:
        super().__init__(app)
        self.rules = rules
        self.sessions = Sessions(rules)
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
        if local_path(request) in OPEN_PATHS:
            return await call_next(request)
        if not self.rules.guarded:
            # Open to this machine (or to the host application's own login): all
            # admins, named in the audit by the host's user when there is one.
            user = _scope_user(request)
            request.scope[SCOPE_KEY] = LOCAL if user is None else Access(user, ADMIN)
            return await call_next(request)
        login = request.query_params.get("token")
        if login is not None and request.method == "GET":
            return self._login(request, login)
        found = self._identify(request)
        if isinstance(found, Response):
            return found
        if found is None:
            return PlainTextResponse(
                "this dashboard needs its token: send 'Authorization: Bearer <token>', "
                "or open any page once with ?token=<token>",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="conveyor"'},
            )
        if request.method not in ("GET", "HEAD") and not found.can_act:
            return PlainTextResponse(
                f"{found.who} may read this dashboard but not act: this needs the admin role",
                status_code=403,
            )
        request.scope[SCOPE_KEY] = found
        return await call_next(request)

    def _identify(self, request: Request) -> Access | Response | None:
        user = _scope_user(request)
        if user is None and self.rules.user_header:
            user = request.headers.get(self.rules.user_header, "").strip() or None
        if user is not None:
            role = self.rules.role_of(user)
            if role is None:
                return PlainTextResponse(f"{user} may not use this dashboard", status_code=403)
            return Access(user, role)
        role = self.rules.token_role(_bearer(request))
        if role is not None:
            return Access(f"{role} token", role)
        return self.sessions.read(request.cookies.get(SESSION_COOKIE))

    def _login(self, request: Request, given: str) -> Response:
        role = self.rules.token_role(given)
        if role is None:
            return PlainTextResponse("wrong token", status_code=401)
        # Trade the token in the address for a signed session, and drop it from
        # the address so it stays out of history and screenshots.
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = URL(path=request.url.path, query=urlencode(rest))
        response = RedirectResponse(str(target), status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            self.sessions.issue(Access(f"{role} token", role)),
            max_age=SESSION_SECONDS,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response


def local_path(request: Request) -> str:
    """The path below where the dashboard is mounted."""
    path: str = request.scope.get("path", "")
    root: str = request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _scope_user(request: Request) -> str | None:
    """The host application's authenticated user's name (Starlette's AuthenticationMiddleware)."""
    if "user" not in request.scope:
        return None
    user = request.scope["user"]
    if not getattr(user, "is_authenticated", False):
        return None
    name = getattr(user, "display_name", None) or getattr(user, "identity", None) or str(user)
    return str(name)


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
