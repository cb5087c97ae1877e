"""The dashboard's routes: pages, their live fragments, actions, /metrics and /healthz.

Pages are rendered on the server from the App's store and work without
script; static/live.js only refreshes the live part of a page (the same URL,
asked with the ``X-Conveyor-Live`` header, answers that part alone) and asks
before destructive forms. Store calls are synchronous, so pages are plain
functions (Starlette runs them in its thread pool) and actions run their store
calls there too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from conveyor import audit
from conveyor.app import App
from conveyor.cli.signals import with_spawned
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    JobNotFoundError,
    SchemaMissingError,
)
from conveyor.expiry import is_expired
from conveyor.export import csv_lines, exported_jobs, jsonl_lines
from conveyor.fair import job_fair_key
from conveyor.job import DETAILED_STATES, FILTER_STATES, JobState, utcnow
from conveyor.signals import spawned
from conveyor.store.expiring import deadline_of
from conveyor.store.limit_keys import MAX_THROTTLED_KEYS
from conveyor.store.retaining import RetainingStore, kept_line
from conveyor.store.selection import ARGS_SEARCH_SPAN
from conveyor.web import charts, graph, task_metrics, views
from conveyor.web.auditing import audit_action
from conveyor.web.fair import fair_context, parse_weights
from conveyor.web.format import FILTERS
from conveyor.web.hosts import LOOPBACK_NAMES
from conveyor.web.limits import limit_rows
from conveyor.web.metrics import Metrics, metrics_down, metrics_response
from conveyor.web.outage import Outage, StoreWatch, unreachable
from conveyor.web.params import (
    FILTER_NAMES,
    BadRequest,
    job_id_in_range,
    parse_filters,
    parse_id,
    query,
)
from conveyor.web.security import (
    CSRF_FIELD,
    AccessRules,
    CsrfTokens,
    Guard,
    RoleMap,
    access_of,
    foreign_origin,
)


class NameConvertor(PathConvertor):
    """A queue or workflow name in a path, whatever characters it holds.

    Starlette's ``path`` matches ``.*``, which stops at a newline (and its route's
    ``$`` then matches before a trailing one): a name with a newline would miss
    its page or reach another queue's. Any character, newlines included.
    """

    regex = r"[\s\S]*"


register_url_convertor("name", NameConvertor())


#: The headers of the overview's counts: short, so the queue table fits 1024 px
#: (each with its full name as a tooltip; a queue's card on a phone says it whole).
SHORT_STATES = {
    "waiting": "wait",
    "ready": "ready",
    "scheduled": "sched.",
    "retrying": "retry",
    "running": "run",
    "succeeded": "done",
    "failed": "failed",
    "cancelled": "canc.",
}
#: Filters whose count is read from indexes or the overview's counts, at every refresh.
CHEAP_COUNT_FILTERS = {"state", "queue", "group", "batch"}
#: Seconds a count of other filters is kept (it reads the matching jobs).
COUNT_FRESH = 30.0
#: Seconds between refreshes of a page's live part.
REFRESH_SECONDS = 5
PAGE_SIZE = 50
#: A form body is a few short fields and at most a page of ids; anything bigger is not ours.
MAX_FORM_BYTES = 64 * 1024
PURGE_CHOICES = {
    "0s": timedelta(0),
    "1h": timedelta(hours=1),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
#: The header live.js sends to ask for a page's live part alone.
LIVE_HEADER = "x-conveyor-live"
#: Messages an action can leave for the page it redirects to (by code: the
#: address never carries text to show). An action on a queue names it: the
#: address carries the queue, shown only if the store knows a queue of that name.
NOTICES = {
    "worker_quiet": "Worker asked to go quiet: it claims nothing new from its next check-in.",
    "worker_resume": "Worker asked to claim again.",
    "worker_stop": "Worker asked to stop: it drains its running jobs, then exits.",
    "worker_concurrency": "Worker asked to change its slots at its next check-in.",
    "signal_woke": "Signal sent: the job was waiting for it and is due now.",
    "signal_kept": "Signal sent: kept until the job waits for it.",
    "retried": "Job queued again.",
    "cancelled": "Job cancelled.",
    "cancel_requested": "Cancel requested: the worker running it will stop it.",
    "run_now": "Job made due now: the next free worker takes it.",
    "held": "Job held: no worker claims it until it is let go.",
    "unheld": "Job let go: it runs at its time (now, if that has passed).",
    "deleted": "Job deleted with its history.",
    "taken_back": "Job taken back from its worker and queued again.",
    "taken_back_failed": "Job taken back from its worker; out of attempts, it failed.",
    "paused": "Queue{queue} paused: workers no longer claim its jobs.",
    "resumed": "Queue{queue} resumed.",
    "retried_all": "Failed jobs of the queue{queue} queued again: {n}.",
    "purged": "Finished jobs deleted: {n}.",
    "queue_deleted": "Queue{queue} deleted with its jobs: {n}.",
    "fair_set": "Fair turns set{on}: every worker claims so within a second.",
    "fair_off": "Fair turns off{on}: claims take the oldest ready job of the highest priority.",
    "bulk_retry": "Jobs queued again: {n}.",
    "bulk_cancel": "Jobs cancelled or asked to stop: {n}.",
    "bulk_delete": "Jobs deleted: {n}.",
    "bulk_run_now": "Jobs made due now: {n}.",
    "bulk_take_back": "Running jobs taken back (queued again, or failed if out of attempts): {n}.",
    "none_selected": "Tick the jobs to act on first.",
    "limit_set": "Limit set{on}: workers obey it from their next claim.",
    "limit_cleared": "Limit cleared{on}.",
    "throttle_lifted": "Throttle lifted{on}.",
    "workflow_cancelled": "Jobs of the workflow cancelled or asked to stop: {n}.",
    "workflow_retried": "Jobs of the workflow put back to run again: {n}.",
}


def create_app(
    app: App,
    token: str | None = None,
    *,
    read_token: str | None = None,
    user_header: str | None = None,
    roles: RoleMap | None = None,
    secret: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application.

    With ``token`` (admin) or ``read_token`` (read-only), every request must
    carry one, or come from a user the host application's authentication
    (the scope's ``user``) or a trusted proxy's ``user_header`` names, whose
    role ``roles`` gives (see conveyor.web.security). ``secret`` signs the
    session cookies (by default a key from the tokens).
    ``allowed_hosts`` are the Host names it answers to; by default the
    loopback names when nobody needs to say who they are (a page elsewhere
    cannot reach it through DNS rebinding) and any name otherwise. ``["*"]``
    allows any name, for a dashboard behind a proxy or a host application that checks.
    """
    rules = AccessRules(token, read_token, user_header, roles, secret)
    return Dashboard(app).build(rules, _hosts(rules, allowed_hosts))


def create_app_opening(
    opener: Callable[[], App],
    store: str,
    rules: AccessRules,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of the App ``opener`` gives, opened by the first request that can;
    who may do what as ``create_app``'s arguments make ``rules``.

    For a store that cannot be reached when the dashboard starts: until it can,
    every page answers 503 naming ``store`` (a DSN without its password), as
    while any outage.
    """
    return Dashboard(None, opener=opener, store=store).build(rules, _hosts(rules, allowed_hosts))


def _hosts(rules: AccessRules, allowed_hosts: Sequence[str] | None) -> Sequence[str] | None:
    if allowed_hosts is None:
        allowed_hosts = ["*"] if rules.guarded else LOOPBACK_NAMES
    return None if "*" in allowed_hosts else allowed_hosts


class Dashboard:
    def __init__(
        self,
        app: App | None,
        *,
        opener: Callable[[], App] | None = None,
        store: str | None = None,
    ) -> None:
        self._app = app
        self._opener = opener
        self._opening = threading.Lock()
        #: How the pages name the store (never with a password).
        self.store_name = store if store is not None else app.description if app else "?"
        self.csrf = CsrfTokens()
        self._metrics = Metrics(app) if app is not None else None
        #: Counts of lists whose filters read the jobs: filters -> (when, count).
        self._counts: dict[tuple[tuple[str, str], ...], tuple[float, int]] = {}
        self._counts_lock = threading.Lock()
        #: Whether the store answered last time (pages answer 503 at once while it does not).
        self.watch = StoreWatch()
        #: Set once the schema was found in place; cleared when a table goes missing.
        self.schema_ok = False
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("conveyor.web", "templates"),
            # Every value is escaped unless a template says otherwise, and none does:
            # job arguments, results and errors are data from anywhere.
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters.update(FILTERS)
        env.globals.update(
            csrf_field=CSRF_FIELD,
            states=[str(s) for s in JobState],
            detailed_states=list(DETAILED_STATES),
            short_states=SHORT_STATES,
            filter_states=list(FILTER_STATES),
            refresh=REFRESH_SECONDS,
            query=query,
            args_span=ARGS_SEARCH_SPAN,
        )
        self.templates = Jinja2Templates(env=env)

    @property
    def app(self) -> App:
        """The App; opened now if the dashboard started without one (raises while it cannot)."""
        if self._app is None:
            with self._opening:
                if self._app is None:
                    if self._opener is None:
                        raise RuntimeError("a dashboard needs an App or a way to open one")
                    self._app = self._opener()
                    self.store_name = self._app.description
        return self._app

    @property
    def metrics(self) -> Metrics:
        if self._metrics is None:
            self._metrics = Metrics(self.app)
        return self._metrics

    def build(self, rules: AccessRules, allowed_hosts: Sequence[str] | None) -> Starlette:
        static = resources.files("conveyor.web").joinpath("static")
        routes = [
            Route("/", self.page(self.overview), name="overview"),
            Route("/live", self.page(self.overview_live), name="live"),
            Route("/jobs", self.page(self.job_list), name="jobs"),
            Route("/jobs/confirm", self.page(self.bulk_confirm), name="bulk_confirm"),
            Route("/jobs/export", self.page(self.job_export), name="jobs_export"),
            Route("/jobs/bulk", self.bulk_selected, methods=["POST"]),
            Route("/jobs/bulk-matching", self.bulk_matching, methods=["POST"]),
            Route("/jobs/{job_id:int}", self.page(self.job_page), name="job"),
            Route("/jobs/{job_id:int}/signal", self.job_signal, methods=["POST"]),
            Route("/jobs/{job_id:int}/{action}", self.job_action, methods=["POST"]),
            Route("/workers", self.page(self.workers_page), name="workers"),
            Route("/workflows", self.page(self.workflows_page), name="workflows"),
            Route("/workflows/{workflow_id:name}/cancel", self.workflow_cancel, methods=["POST"]),
            Route("/workflows/{workflow_id:name}/retry", self.workflow_retry, methods=["POST"]),
            Route("/workflows/{workflow_id:name}", self.page(self.workflow_page), name="workflow"),
            Route("/workers/take-back", self.worker_take_back, methods=["POST"]),
            Route("/workers/control", self.worker_control, methods=["POST"]),
            Route("/periodic", self.page(self.periodic_page), name="periodic"),
            Route("/audit", self.page(self.audit_page), name="audit"),
            Route("/tasks", self.page(self.tasks_page), name="tasks"),
            Route("/queues/{queue:name}/pause", self.queue_pause, methods=["POST"]),
            Route("/queues/{queue:name}/resume", self.queue_resume, methods=["POST"]),
            Route("/queues/{queue:name}/retry-failed", self.queue_retry_failed, methods=["POST"]),
            Route(
                "/queues/{queue:name}/delete",
                self.queue_delete,
                methods=["GET", "POST"],
                name="queue_delete",
            ),
            Route("/limits/{queue:name}/set", self.limit_set, methods=["POST"]),
            Route("/limits/{queue:name}/clear", self.limit_clear, methods=["POST"]),
            Route("/limits/{queue:name}/lift", self.limit_lift, methods=["POST"]),
            Route("/limits/{queue:name}/fair", self.fair_set, methods=["POST"]),
            Route("/limits/{queue:name}", self.page(self.limit_page), name="limit"),
            Route("/purge", self.purge, methods=["GET", "POST"], name="purge"),
            Route("/metrics", self.metrics_text, name="metrics"),
            Route("/healthz", self.healthz, name="healthz"),
            Mount("/static", StaticFiles(directory=str(static)), name="static"),
        ]
        middleware = [Middleware(Guard, rules=rules, allowed_hosts=allowed_hosts)]
        return Starlette(routes=routes, middleware=middleware)

    # --- answering: pages, errors, a missing schema ---------------------------------------

    def render(
        self, request: Request, name: str, context: dict[str, Any], status_code: int = 200
    ) -> Response:
        access = access_of(request)
        context = {
            "csrf_token": self.csrf.value,
            # Asked only for a notice naming a queue: an outage page has no App to ask.
            "notice": notice(request, lambda: self.app.queue_names()),
            # Links start at the mount's path; a read-only user gets no action buttons.
            "root": request.scope.get("root_path", ""),
            "can_act": access.can_act,
            "who": access.who,
            **context,
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    def problem(self, request: Request, message: str, status_code: int) -> Response:
        return self.render(request, "error.html", {"message": message}, status_code)

    def page(self, view: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """A page that answers what went wrong as a page of its own, never a 500.

        A database without conveyor's tables gives the "run conveyor migrate" page
        (503, as /healthz); what the browser sent that cannot be right, a 400.
        """

        def answer(request: Request) -> Response:
            outage = self.watch.wait()
            if outage is not None:
                return self.unavailable(request, outage)
            try:
                self.require_schema()
                response = view(request)
            except BadRequest as exc:
                self.watch.settle()
                return self.problem(request, str(exc), 400)
            except SchemaMissingError as exc:
                # The stores translate a table gone missing at their boundary: the
                # schema was dropped (or never made) and is checked again from now on.
                self.schema_ok = False
                self.watch.answered()
                return self.migrate_page(request, exc)
            except Exception as exc:
                if unreachable(exc):
                    return self.unavailable(request, self.watch.failed(exc))
                self.watch.settle()
                raise
            self.watch.answered()
            return response

        return answer

    def unavailable(self, request: Request, outage: Outage, acting: bool = False) -> Response:
        """503 in the page frame: which store, what it said, and that the dashboard retries."""
        context = {
            "store": self.store_name,
            "outage": outage,
            "retry": int(self.watch.retry),
            "acting": acting,
        }
        name = "_unavailable.html" if self.live(request) else "unavailable.html"
        return self.render(request, name, context, 503)

    def require_schema(self) -> None:
        """Check the schema until it is found in place (a query per page until then)."""
        if not self.schema_ok:
            self.app.check_schema()
            self.schema_ok = True

    def migrate_page(self, request: Request, exc: SchemaMissingError | None) -> Response:
        message = str(exc) if exc is not None else "a table of conveyor is missing"
        try:
            self.app.check_schema()
        except SchemaMissingError as missing:
            message = str(missing)
        except Exception as other:
            if not unreachable(other):
                raise
            return self.unavailable(request, self.watch.failed(other))
        return self.render(request, "migrate.html", {"message": message}, 503)

    def live(self, request: Request) -> bool:
        """Whether live.js asks for the page's live part alone."""
        return request.headers.get(LIVE_HEADER) == "1"

    # --- pages ------------------------------------------------------------------

    def overview_context(self) -> dict[str, Any]:
        now = utcnow()
        stats = self.app.stats()
        start = now - charts.WINDOW
        rows = self.app.finished_per_slot(start, charts.SLOT)
        overall = charts.bar_chart(charts.per_slot(rows, None), start, 720, 120)
        sparks = {
            name: charts.bar_chart(charts.per_slot(rows, name), start, 180, 28, gap=0.5)
            for name in stats.queues
        }
        workers = self.app.workers()
        return {
            "now": now,
            "stats": stats,
            "limits": limit_rows(stats.limits),
            "chart": overall,
            "sparks": sparks,
            "workers": workers,
            "purge_choices": list(PURGE_CHOICES),
        }

    def overview(self, request: Request) -> Response:
        name = "_live.html" if self.live(request) else "overview.html"
        return self.render(request, name, self.overview_context())

    def overview_live(self, request: Request) -> Response:
        return self.render(request, "_live.html", self.overview_context())

    def job_list(self, request: Request) -> Response:
        filters = parse_filters(request.query_params)
        before_id = parse_id(request.query_params.get("before"), "before")
        jobs = self.app.jobs(
            limit=PAGE_SIZE + 1,  # one more than shown: is there an older page?
            before_id=before_id,
            **filters,
        )
        older = None
        if len(jobs) > PAGE_SIZE:
            jobs = jobs[:PAGE_SIZE]
            older = query({**filters, "before": jobs[-1].id})
        newest = query(filters) or "?" if before_id is not None else None
        group_counts = None
        if "group" in filters:
            group_counts = self.app.count_jobs(None, group=filters["group"])
        context = {
            "jobs": jobs,
            "matching": self.count_matching(filters),
            "filters": filters,
            "filter_query": query(filters),
            "queues": self.app.queue_names(),
            "older": older,
            "newest": newest,
            "now": utcnow(),
            "group_counts": group_counts,
            "bulk_actions": views.BULK_ACTIONS,
            "before": before_id,
        }
        name = "_jobs_table.html" if self.live(request) else "jobs.html"
        return self.render(request, name, context)

    def job_export(self, request: Request) -> Response:
        """The list's jobs with their events, as JSON lines or CSV (``conveyor export``)."""
        filters = parse_filters(request.query_params)
        fmt = request.query_params.get("format", "jsonl")
        if fmt not in ("jsonl", "csv"):
            raise BadRequest(f"export as jsonl or csv, not {fmt!r}")
        records = exported_jobs(self.app, filters)
        lines = csv_lines(records) if fmt == "csv" else jsonl_lines(records)
        name = f"conveyor-jobs.{fmt}"
        media = "text/csv" if fmt == "csv" else "application/x-ndjson"
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        return StreamingResponse(lines, media_type=media, headers=headers)

    def count_matching(self, filters: dict[str, str]) -> int:
        """How many jobs a list's filters match; kept COUNT_FRESH seconds for filters that
        read the jobs (a task, worker, key or text), so the list's refresh every few seconds
        does not count them again each time."""
        if set(filters) <= CHEAP_COUNT_FILTERS:
            return self.app.count_matching(**filters)
        key = tuple(sorted(filters.items()))
        now = time.monotonic()
        with self._counts_lock:
            kept = self._counts.get(key)
        if kept is not None and now - kept[0] < COUNT_FRESH:
            return kept[1]
        counted = self.app.count_matching(**filters)
        with self._counts_lock:
            if len(self._counts) >= 64:
                self._counts.clear()
            self._counts[key] = (now, counted)
        return counted

    def job_page(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]
        try:
            if not job_id_in_range(job_id):
                raise JobNotFoundError(f"no job with id {job_id}: ids are 64-bit numbers")
            job = self.app.get(job_id)
        except JobNotFoundError as exc:
            return self.problem(request, str(exc), 404)
        steps = self.app.steps(job_id) if self.app.capabilities().steps else []
        context = {
            "job": job,
            "events": self.app.events(job_id),
            "steps": steps,
            "now": utcnow(),
            "parents": self.app.parents(job_id),
            "children": self.app.children(job_id),
            "workflow": self.app.workflow_of(job_id),
            "why": self.app.why(job_id) if job.state in ("waiting", "queued") else None,
            **views.waits_of(self.app, job),
            "spawned": spawned(steps),
            "expires_at": deadline_of(self.app.expiry, job_id),
            "expired": is_expired(job),
            "kept": kept_line(self.app.port(RetainingStore), job_id),
            "fair_key": job_fair_key(self.app, job_id),
        }
        name = "_job_live.html" if self.live(request) else "job.html"
        return self.render(request, name, context)

    def bulk_confirm(self, request: Request) -> Response:
        """What an action on every job matching the filters would change, and its button."""
        action = views.BULK_ACTIONS.get(request.query_params.get("action", ""))
        if action is None:
            raise BadRequest("unknown action: retry, cancel, delete, run-now or take-back")
        filters = parse_filters(request.query_params)
        if not filters:
            raise BadRequest("choose a filter first: an action on every job needs one")
        counts = self.app.count_jobs(None, **filters)
        changing = sum(counts.get(state, 0) for state in action.applies_to)
        context = {
            "action": action,
            "filters": filters,
            "filter_query": query(filters),
            "counts": counts,
            "matching": sum(counts.values()),
            "changing": changing,
        }
        return self.render(request, "confirm.html", context)

    def workers_page(self, request: Request) -> Response:
        now = utcnow()
        workers = self.app.workers()
        context = {"now": now, "workers": workers, "orphans": views.orphans(self.app, workers)}
        name = "_workers.html" if self.live(request) else "workers.html"
        return self.render(request, name, context)

    def workflows_page(self, request: Request) -> Response:
        now = utcnow()
        found = self.app.workflows(limit=PAGE_SIZE)
        rows = [(w, self.app.workflow_status(w.id).counts) for w in found]
        name = "_workflows.html" if self.live(request) else "workflows.html"
        return self.render(request, name, {"now": now, "rows": rows})

    def workflow_page(self, request: Request) -> Response:
        workflow_id: str = request.path_params["workflow_id"]
        try:
            run = self.app.workflow(workflow_id)
        except JobNotFoundError as exc:
            return self.problem(request, str(exc), 404)
        now = utcnow()
        jobs, edges = with_spawned(self.app, run.jobs, self.app.workflow_edges(workflow_id))
        parents: dict[int, list[int]] = {}
        for child, parent, _ in edges:
            parents.setdefault(child, []).append(parent)
        drawn = len(jobs) <= graph.MAX_DRAWN
        context = {
            "now": now,
            "run": run,
            "status": self.app.workflow_status(workflow_id),
            "graph": graph.layout(jobs, edges, now) if drawn else None,
            "box_w": graph.BOX_W,
            "box_h": graph.BOX_H,
            "parents": parents,
            "shown_jobs": jobs[: graph.MAX_DRAWN],
        }
        name = "_workflow_live.html" if self.live(request) else "workflow.html"
        return self.render(request, name, context)

    async def workflow_cancel(self, request: Request) -> Response:
        workflow_id: str = request.path_params["workflow_id"]

        def cancel(form: dict[str, list[str]]) -> str:
            self.app.workflow(workflow_id)  # an unknown id says so
            return f"workflow_cancelled:{self.app.cancel_workflow(workflow_id)}"

        return await self.act(request, cancel, f"/workflows/{quote(workflow_id, safe='')}")

    async def workflow_retry(self, request: Request) -> Response:
        workflow_id: str = request.path_params["workflow_id"]

        def retry(form: dict[str, list[str]]) -> str:
            return f"workflow_retried:{self.app.retry_workflow(workflow_id)}"

        return await self.act(request, retry, f"/workflows/{quote(workflow_id, safe='')}")

    def periodic_page(self, request: Request) -> Response:
        now = utcnow()
        context = {
            "now": now,
            "rows": views.periodic_rows(self.app, now),
            "knows_schedules": bool(self.app.periodic_tasks),
        }
        name = "_periodic.html" if self.live(request) else "periodic.html"
        return self.render(request, name, context)

    def audit_page(self, request: Request) -> Response:
        """Operators' actions, newest first, a page at a time (from the store's audit)."""
        before = parse_id(request.query_params.get("before"), "before")
        try:
            found = audit.entries(self.app, PAGE_SIZE + 1, before)
        except ConfigurationError as exc:  # a store without an audit says so
            return self.problem(request, str(exc), 404)
        older = found[PAGE_SIZE - 1].id if len(found) > PAGE_SIZE else None
        context = {"entries": found[:PAGE_SIZE], "older": older, "before": before}
        return self.render(request, "audit.html", context)

    # --- actions ----------------------------------------------------------------

    async def act(
        self, request: Request, action: Callable[[dict[str, list[str]]], str], back: str
    ) -> Response:
        """Check a POST (CSRF, origin), run ``action`` off the event loop, redirect back.

        ``action`` answers the notice to show (a code of NOTICES, optionally
        ``code:n``), and may end in ``@path?query`` to go elsewhere than ``back``;
        a ConveyorError (a retry of a running job, ...) is shown as a 409 page, a
        BadRequest as a 400 one.
        """
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            return PlainTextResponse("form too large", status_code=413)
        form = parse_qs(body.decode("utf-8", "replace"))
        token = first(form, CSRF_FIELD) or None
        if foreign_origin(request) or not self.csrf.valid(token):
            return self.problem(
                request, "This form is stale or came from another site: reload the page.", 403
            )
        outage = self.watch.wait()
        if outage is not None:
            return self.unavailable(request, outage, acting=True)
        try:
            await run_in_threadpool(self.require_schema)
            code = await run_in_threadpool(action, form)
            outcome, _, count = code.partition("@")[0].partition(":")
            access, params = access_of(request), dict(request.path_params)
            await run_in_threadpool(audit_action, self.app, access, outcome, count, params, form)
        except BadRequest as exc:
            self.watch.settle()
            return self.problem(request, str(exc), 400)
        except SchemaMissingError as exc:
            self.watch.answered()
            return self.migrate_page(request, exc)
        except Exception as exc:
            if unreachable(exc):
                return self.unavailable(request, self.watch.failed(exc), acting=True)
            if not isinstance(exc, ConveyorError):
                self.watch.settle()
                raise
            self.watch.answered()
            return self.problem(request, str(exc), 409)
        self.watch.answered()
        code, _, target = code.partition("@")
        code, _, n = code.partition(":")
        params = {"notice": code, **({"n": n} if n else {})}
        if "queue" in request.path_params:
            params["queue"] = request.path_params["queue"]
        root = request.scope.get("root_path", "")  # back within the mount
        if target:
            path, _, rest = target.partition("?")
            extra = parse_qs(rest)
            pairs = [(k, v[0]) for k, v in extra.items()] + list(params.items())
            return RedirectResponse(f"{root}{path}?{urlencode(pairs)}", status_code=303)
        return RedirectResponse(f"{root}{back}?{urlencode(params)}", status_code=303)

    async def job_action(self, request: Request) -> Response:
        job_id: int = request.path_params["job_id"]
        name: str = request.path_params["action"]
        if name not in views.JOB_ACTIONS:
            return self.problem(request, f"no action {name!r} on a job", 404)

        def run(form: dict[str, list[str]]) -> str:
            if not job_id_in_range(job_id):
                raise JobNotFoundError(f"no job with id {job_id}")
            return views.act_on_job(self.app, name, job_id)

        return await self.act(request, run, f"/jobs/{job_id}")

    async def job_signal(self, request: Request) -> Response:
        """Send the job a signal (``ctx.wait_for``): its name and JSON payload from the form."""
        job_id: int = request.path_params["job_id"]

        def run(form: dict[str, list[str]]) -> str:
            if not job_id_in_range(job_id):
                raise JobNotFoundError(f"no job with id {job_id}")
            name, payload = views.signal_form(first(form, "name"), first(form, "payload"))
            return "signal_woke" if self.app.signal(job_id, name, payload) else "signal_kept"

        return await self.act(request, run, f"/jobs/{job_id}")

    async def bulk_selected(self, request: Request) -> Response:
        """The ticked jobs of a list, and the action chosen for them."""

        def run(form: dict[str, list[str]]) -> str:
            back = "/jobs" + query(parse_filters(first_values(form)))
            action = views.BULK_ACTIONS.get(first(form, "action"))
            if action is None:
                raise BadRequest("choose an action: retry, cancel, delete, run now or take back")
            ids = [i for i in (parse_id(v) for v in form.get("id", [])) if i is not None]
            if not ids:
                return "none_selected@" + back
            changed = getattr(self.app, action.method)(ids)
            return f"bulk_{action.code}:{changed}@{back}"

        return await self.act(request, run, "/jobs")

    async def bulk_matching(self, request: Request) -> Response:
        """An action on every job matching the filters (confirmed on /jobs/confirm)."""

        def run(form: dict[str, list[str]]) -> str:
            filters = parse_filters(first_values(form))
            action = views.BULK_ACTIONS.get(first(form, "action"))
            if action is None:
                raise BadRequest("choose an action: retry, cancel, delete, run now or take back")
            if not filters:
                raise BadRequest("choose a filter first: an action on every job needs one")
            changed = getattr(self.app, action.method)(None, **filters)
            return f"bulk_{action.code}:{changed}@/jobs{query(filters)}"

        return await self.act(request, run, "/jobs")

    async def worker_take_back(self, request: Request) -> Response:
        def run(form: dict[str, list[str]]) -> str:
            worker = first(form, "worker")
            if not worker:
                raise BadRequest("name the worker whose jobs to take back")
            return f"bulk_take_back:{self.app.take_back(None, worker=worker)}"

        return await self.act(request, run, "/workers")

    async def worker_control(self, request: Request) -> Response:
        def run(form: dict[str, list[str]]) -> str:
            worker, control = first(form, "worker"), first(form, "control")
            if control == "concurrency":
                slots = first(form, "slots").strip()
                if not slots.isdigit():
                    raise BadRequest("give the worker's slots as a whole number")
                self.app.control_worker(worker, concurrency=int(slots))
            elif control in ("quiet", "resume", "stop"):
                asked = {"stop": True} if control == "stop" else {"quiet": control == "quiet"}
                self.app.control_worker(worker, **asked)
            else:
                raise BadRequest("ask a worker to quiet, resume, stop or change its slots")
            return f"worker_{control}"

        return await self.act(request, run, "/workers")

    async def queue_pause(self, request: Request) -> Response:
        return await self.queue_act(request, self.app.pause, "paused")

    async def queue_resume(self, request: Request) -> Response:
        return await self.queue_act(request, self.app.resume, "resumed")

    async def queue_retry_failed(self, request: Request) -> Response:
        return await self.queue_act(request, self.app.retry_failed, "retried_all:{}")

    async def queue_delete(self, request: Request) -> Response:
        if request.method == "GET":
            return await run_in_threadpool(self.page(self.queue_delete_confirm), request)
        return await self.queue_act(request, self.app.delete_queue, "queue_deleted:{}")

    async def queue_act(
        self, request: Request, act: Callable[[str], object], done: str
    ) -> Response:
        """An action on the queue of the path: ``act(queue)``, then the notice ``done``
        with what it returned (a count) in its ``{}``."""
        queue: str = request.path_params["queue"]

        def run(form: dict[str, list[str]]) -> str:
            return done.format(act(queue))

        return await self.act(request, run, "/")

    def queue_delete_confirm(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]
        parse_filters({"queue": queue})  # a name the databases can hold, or a 400
        if queue not in self.app.queue_names():
            return self.problem(request, f"no queue named {queue!r}", 404)
        counts = self.app.count_jobs(None, queue=queue)
        context = {"queue": queue, "counts": counts, "total": sum(counts.values())}
        return self.render(request, "queue_delete.html", context)

    def limit_page(self, request: Request) -> Response:
        """A queue's limits, how full they are, and the forms to set, clear and lift them."""
        queue: str = request.path_params["queue"]
        parse_filters({"queue": queue})  # a name the databases can hold, or a 400
        status = self.app.limits().get(queue)
        context = {
            "queue": queue,
            "status": status,
            "row": limit_rows({queue: status})[0] if status is not None else None,
            "now": utcnow(),
            "throttled_keys": self.app.throttled_keys(queue, MAX_THROTTLED_KEYS),
            "turns": fair_context(self.app, queue),
        }
        return self.render(request, "limit.html", context)

    async def limit_set(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def set_limit(form: dict[str, list[str]]) -> str:
            rate, concurrency, per_key = limit_form(form)
            if rate is None and concurrency is None:
                raise BadRequest("give a rate (such as 10/s), a concurrency, or both")
            try:
                self.app.limit(queue, rate, concurrency=concurrency, per_key=per_key)
            except ConfigurationError as exc:
                raise BadRequest(str(exc)) from None
            return "limit_set"

        return await self.act(request, set_limit, limit_path(queue))

    async def fair_set(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def set_fair(form: dict[str, list[str]]) -> str:
            off = first(form, "off") == "1"
            try:
                weights = {} if off else parse_weights(first(form, "weights") or "")
                default = float(first(form, "default_weight") or "1")
                self.app.fair(queue, weights, default_weight=default, enabled=not off)
            except (ConfigurationError, ValueError) as exc:
                raise BadRequest(str(exc)) from None
            return "fair_off" if off else "fair_set"

        return await self.act(request, set_fair, limit_path(queue))

    async def limit_clear(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def clear(form: dict[str, list[str]]) -> str:
            self.app.limit(queue, clear=True, per_key=first(form, "scope") == "key")
            return "limit_cleared"

        return await self.act(request, clear, limit_path(queue))

    async def limit_lift(self, request: Request) -> Response:
        queue: str = request.path_params["queue"]

        def lift(form: dict[str, list[str]]) -> str:
            key = first(form, "limit_key") or None  # a key is data: spaces and all
            try:
                self.app.throttle(queue, 0, limit_key=key)
            except ConveyorError as exc:
                raise BadRequest(str(exc)) from None
            return "throttle_lifted"

        return await self.act(request, lift, limit_path(queue))

    async def purge(self, request: Request) -> Response:
        if request.method == "GET":
            return await run_in_threadpool(self.page(self.purge_confirm), request)

        def purge(form: dict[str, list[str]]) -> str:
            values = {name: first(form, name) for name in ("older_than", "queue")}
            older_than, states, queue = purge_choice(values, form.get("state", []))
            if older_than is None:
                raise ConveyorError("choose how old the finished jobs to delete must be")
            return f"purged:{self.app.purge(older_than, states=states, queue=queue)}"

        return await self.act(request, purge, "/")

    def purge_confirm(self, request: Request) -> Response:
        """How many finished jobs a purge would delete (a dry run), and its button."""
        params = request.query_params
        older_than, states, queue = purge_choice(params, params.getlist("state"))
        if older_than is None:
            raise BadRequest(f"choose an age: one of {', '.join(PURGE_CHOICES)}")
        count = self.app.purge_count(older_than, states=states, queue=queue)
        context = {
            "older_than": params.get("older_than"),
            "states": states or [],
            "queue": queue,
            "count": count,
        }
        return self.render(request, "purge.html", context)

    def tasks_page(self, request: Request) -> Response:
        context = task_metrics.page_context(self.app, request.query_params)
        return self.render(request, "tasks.html", context)

    # --- machines ---------------------------------------------------------------

    def metrics_text(self, request: Request) -> Response:
        """The scrape; while the store is away, ``conveyor_up 0`` alone (200, as exporters do)."""
        outage = self.watch.wait()
        if outage is not None:
            return metrics_response(metrics_down())
        try:
            self.require_schema()
            text = self.metrics.render()
        except SchemaMissingError as exc:
            self.watch.answered()
            return PlainTextResponse(f"# {exc}\n", status_code=503)
        except Exception as exc:
            if not unreachable(exc):
                self.watch.settle()
                raise
            self.watch.failed(exc)
            return metrics_response(metrics_down())
        self.watch.answered()
        return metrics_response(text)

    def healthz(self, request: Request) -> Response:
        try:
            health = self.app.health()
        except Exception as exc:  # the App could not be opened: the store is away
            if not unreachable(exc):
                raise
            health = {"ok": False, "store": self.store_name, "error": str(exc)}
        if health["ok"]:
            self.watch.answered()  # the pages need not wait for their next try to know
        return JSONResponse(health, status_code=200 if health["ok"] else 503)


# --- small helpers ------------------------------------------------------------------------


def first(form: dict[str, list[str]], name: str) -> str:
    values = form.get(name) or [""]
    return values[0]


def first_values(form: dict[str, list[str]]) -> dict[str, str]:
    """The filters of a form (each the first value given)."""
    return {name: first(form, name) for name in FILTER_NAMES if name in form}


def purge_choice(
    values: Any, states: list[str]
) -> tuple[timedelta | None, list[str] | None, str | None]:
    """Age, final states and queue of a purge form; a BadRequest for what cannot be."""
    older_than = PURGE_CHOICES.get(values.get("older_than") or "")
    final = [str(s) for s in JobState if s.terminal]
    for state in states:
        if state not in final:
            raise BadRequest(f"only finished jobs are purged: {', '.join(final)}")
    queue = (values.get("queue") or "").strip() or None
    if queue is not None:
        parse_filters({"queue": queue})
    return older_than, list(dict.fromkeys(states)) or None, queue


def limit_path(queue: str) -> str:
    return "/limits/" + quote(queue, safe="")


def limit_form(form: dict[str, list[str]]) -> tuple[str | None, int | None, bool]:
    """The rate, concurrency and scope of a limit form; a BadRequest for what cannot be."""
    rate = first(form, "rate").strip() or None
    text = first(form, "concurrency").strip()
    concurrency = None
    if text:
        if not (text.isascii() and text.isdigit()) or len(text) > 12:
            raise BadRequest(f"concurrency must be a whole number from 1, got {text[:20]!r}")
        concurrency = int(text)
    return rate, concurrency, first(form, "scope") == "key"


def _known(queue: str, queue_names: Callable[[], list[str]]) -> bool:
    try:
        return queue in queue_names()
    except Exception:  # the store cannot answer now: the notice names no queue
        return False


def notice(request: Request, queue_names: Callable[[], list[str]]) -> str | None:
    code = request.query_params.get("notice")
    text = NOTICES.get(code or "")
    if text is None:
        return None
    n = request.query_params.get("n", "")
    queue = request.query_params.get("queue", "")
    # A queue just deleted is known no more: its notice then says "Queue deleted".
    if queue and ("{queue}" in text or "{on}" in text) and not _known(queue, queue_names):
        queue = ""
    return text.format(
        n=f"{int(n):,}" if n.isascii() and n.isdigit() else "?",
        queue=f" {queue}" if queue else "",
        on=f" on {queue}" if queue else "",
    )
