"""The dashboard's routes: overview, jobs, one job, actions, /metrics and /healthz.

Pages are rendered on the server from the App's store; the only script is
static/live.js, which refreshes the overview. Store calls are synchronous, so
read-only pages are plain functions (Starlette runs them in its thread pool)
and actions run their store calls there too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from conveyor.app import App
from conveyor.errors import ConveyorError, JobNotFoundError
from conveyor.job import JobState, utcnow
from conveyor.web import charts
from conveyor.web.hosts import LOOPBACK_NAMES
from conveyor.web.metrics import Metrics
from conveyor.web.security import CSRF_FIELD, CsrfTokens, Guard, foreign_origin

#: Seconds between refreshes of the overview.
REFRESH_SECONDS = 5
PAGE_SIZE = 50
#: A form body is a few short fields; anything bigger is not ours.
MAX_FORM_BYTES = 16 * 1024
#: Workers not seen for this long are shown as late (they may have died).
LATE_AFTER = timedelta(seconds=60)
PURGE_CHOICES = {"1h": timedelta(hours=1), "1d": timedelta(days=1), "7d": timedelta(days=7)}
#: Messages an action can leave for the page it redirects to (by code: the
#: address never carries text to show).
NOTICES = {
    "retried": "Job queued again.",
    "cancelled": "Job cancelled.",
    "cancel_requested": "Cancel requested: the worker running it will stop it.",
    "paused": "Queue paused: workers no longer claim its jobs.",
    "resumed": "Queue resumed.",
    "retried_all": "Failed jobs of the queue queued again: {n}.",
    "purged": "Finished jobs deleted: {n}.",
}


def create_app(
    app: App,
    token: str | None = None,
    *,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application.

    With ``token``, every request must carry it (see conveyor.web.security).
    ``allowed_hosts`` are the Host names it answers to; by default the
    loopback names when there is no token (a page elsewhere cannot reach it
    through DNS rebinding) and any name when there is one. ``["*"]`` allows
    any name without a token, for a dashboard behind a proxy that checks.
    """
    if allowed_hosts is None:
        allowed_hosts = LOOPBACK_NAMES if token is None else ["*"]
    hosts = None if "*" in allowed_hosts else allowed_hosts
    return Dashboard(app).build(token, hosts)


class Dashboard:
    def __init__(self, app: App) -> None:
        self.app = app
        self.csrf = CsrfTokens()
        self.metrics = Metrics(app)
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("conveyor.web", "templates"),
            # Every value is escaped unless a template says otherwise, and none does:
            # job arguments, results and errors are data from anywhere.
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(
            ago=ago,
            when=when,
            seconds=seconds,
            pretty_json=pretty_json,
            first_line=first_line,
            segment=segment,
        )
        env.globals.update(
            csrf_field=CSRF_FIELD, states=[str(s) for s in JobState], refresh=REFRESH_SECONDS
        )
        self.templates = Jinja2Templates(env=env)

    def build(self, token: str | None, allowed_hosts: Sequence[str] | None) -> Starlette:
        static = resources.files("conveyor.web").joinpath("static")
        routes = [
            Route("/", self.overview, name="overview"),
            Route("/live", self.live, name="live"),
            Route("/jobs", self.job_list, name="jobs"),
            Route("/jobs/{job_id:int}", self.job_page, name="job"),
            Route("/jobs/{job_id:int}/retry", self.job_retry, methods=["POST"]),
            Route("/jobs/{job_id:int}/cancel", self.job_cancel, methods=["POST"]),
            Route("/queues/{queue:path}/pause", self.queue_pause, methods=["POST"]),
            Route("/queues/{queue:path}/resume", self.queue_resume, methods=["POST"]),
            Route("/queues/{queue:path}/retry-failed", self.queue_retry_failed, methods=["POST"]),
            Route("/purge", self.purge, methods=["POST"]),
            Route("/metrics", self.metrics_text, name="metrics"),
            Route("/healthz", self.healthz, name="healthz"),
            Mount("/static", StaticFiles(directory=str(static)), name="static"),
        ]
        middleware = [Middleware(Guard, token=token, allowed_hosts=allowed_hosts)]
        return Starlette(routes=routes, middleware=middleware)

    # --- pages ------------------------------------------------------------------

    def render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        context = {"csrf_token": self.csrf.value, "notice": notice(request), **context}
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    def overview_context(self) -> dict[str, Any]:
        now = utcnow()
        stats = self.app.stats()
        start = now - charts.WINDOW
        rows = self.app.store.stats_finished_per_slot(start, charts.SLOT)
        overall = charts.bar_chart(charts.per_slot(rows, None), start, 720, 120)
        sparks = {
            name: charts.bar_chart(charts.per_slot(rows, name), start, 180, 28, gap=0.5)
            for name in stats.queues
        }
        workers = self.app.store.worker_list()
        return {
            "now": now,
            "stats": stats,
            "chart": overall,
            "sparks": sparks,
            "workers": workers,
            "late_after": LATE_AFTER,
            "purge_choices": list(PURGE_CHOICES),
        }

    def overview(self, request: Request) -> Response:
        return self.render(request, "overview.html", self.overview_context())

    def live(self, request: Request) -> Response:
        return self.render(request, "_live.html", self.overview_context())

    def job_list(self, request: Request) -> Response:
        query = request.query_params
        state = query.get("state") or None
        if state is not None and state not in {str(s) for s in JobState}:
            return self.render(request, "error.html", {"message": "unknown state"}, 400)
        text = {k: (query.get(k) or "").strip() or None for k in ("queue", "task", "batch")}
        error = (query.get("error") or "").strip() or None
        before = query.get("before")
        before_id = int(before) if before and before.isdigit() else None
        jobs = self.app.jobs(
            state=state,
            queue=text["queue"],
            task=text["task"],
            batch=text["batch"],
            error=error,
            before_id=before_id,
            limit=PAGE_SIZE + 1,  # one more than shown: is there an older page?
        )
        filters = {"state": state, **text, "error": error}
        kept = {k: v for k, v in filters.items() if v}
        older = None
        if len(jobs) > PAGE_SIZE:
            jobs = jobs[:PAGE_SIZE]
            older = "?" + urlencode({**kept, "before": jobs[-1].id})
        newest = "?" + urlencode(kept) if before_id is not None else None
        return self.render(
            request,
            "jobs.html",
            {
                "jobs": jobs,
                "filters": filters,
                "queues": self.app.store.queue_names(),
                "older": older,
                "newest": newest,
                "now": utcnow(),
            },
        )

    def job_page(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]
        try:
            job = self.app.get(job_id)
        except JobNotFoundError as exc:
            return self.render(request, "error.html", {"message": str(exc)}, 404)
        return self.render(
            request, "job.html", {"job": job, "events": self.app.events(job_id), "now": utcnow()}
        )

    # --- actions ----------------------------------------------------------------

    async def act(
        self, request: Request, action: Callable[[dict[str, str]], str], back: str
    ) -> Response:
        """Check a POST (CSRF, origin), run ``action`` off the event loop, redirect back.

        ``action`` answers the notice to show (a code of NOTICES, optionally
        ``code:n``); a ConveyorError (a retry of a running job, ...) is shown
        as a 409 page instead.
        """
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return PlainTextResponse("form too large", status_code=413)
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        if foreign_origin(request) or not self.csrf.valid(form.get(CSRF_FIELD)):
            return self.render(
                request,
                "error.html",
                {"message": "This form is stale or came from another site: reload the page."},
                403,
            )
        try:
            code = await run_in_threadpool(action, form)
        except ConveyorError as exc:
            return self.render(request, "error.html", {"message": str(exc)}, 409)
        code, _, n = code.partition(":")
        params = {"notice": code, **({"n": n} if n else {})}
        return RedirectResponse(f"{back}?{urlencode(params)}", status_code=303)

    async def job_retry(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]

        def retry(form: dict[str, str]) -> str:
            self.app.retry(job_id)
            return "retried"

        return await self.act(request, retry, f"/jobs/{job_id}")

    async def job_cancel(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]

        def cancel(form: dict[str, str]) -> str:
            job = self.app.cancel(job_id)
            return "cancel_requested" if job.state == JobState.RUNNING else "cancelled"

        return await self.act(request, cancel, f"/jobs/{job_id}")

    async def queue_pause(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def pause(form: dict[str, str]) -> str:
            self.app.pause(queue)
            return "paused"

        return await self.act(request, pause, "/")

    async def queue_resume(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def resume(form: dict[str, str]) -> str:
            self.app.resume(queue)
            return "resumed"

        return await self.act(request, resume, "/")

    async def queue_retry_failed(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def retry_all(form: dict[str, str]) -> str:
            return f"retried_all:{self.app.retry_failed(queue)}"

        return await self.act(request, retry_all, "/")

    async def purge(self, request: Request) -> Response:
        def purge(form: dict[str, str]) -> str:
            older_than = PURGE_CHOICES.get(form.get("older_than", ""))
            if older_than is None:
                raise ConveyorError("choose how old the finished jobs to delete must be")
            return f"purged:{self.app.purge(older_than)}"

        return await self.act(request, purge, "/")

    # --- machines ---------------------------------------------------------------

    def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(
            self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    def healthz(self, request: Request) -> Response:
        health = self.app.health()
        return JSONResponse(health, status_code=200 if health["ok"] else 503)


# --- template filters -------------------------------------------------------------


def notice(request: Request) -> str | None:
    code = request.query_params.get("notice")
    text = NOTICES.get(code or "")
    if text is None:
        return None
    n = request.query_params.get("n", "")
    return text.format(n=int(n) if n.isdigit() else "?")


def segment(value: str) -> str:
    """A name quoted to stand as one path segment (queue names may hold a slash)."""
    return quote(value, safe="")


def seconds(value: float | None) -> str:
    """A duration as people read it: 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    if value is None:
        return "—"
    total = int(value)
    if total < 60:
        return f"{value:.1f} s" if value < 10 else f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    delta = (now - value).total_seconds()
    return f"{seconds(delta)} ago" if delta >= 0 else f"in {seconds(-delta)}"


def when(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def pretty_json(text: str | None) -> str:
    if text is None:
        return "—"
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        return text


def first_line(text: str | None, limit: int = 120) -> str:
    if not text:
        return ""
    # The last line of a traceback names the exception; the first says "Traceback".
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines and lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"
