"""What a dashboard action tells the audit: its name, what it acted on, how many jobs.

Read off the action's outcome (the notice code every action answers, with its
count) and the request (the path's job, queue or workflow, the form's filters),
so that the routes themselves record nothing and a new action is named here.
"""

from __future__ import annotations

from urllib.parse import urlencode

from conveyor.app import App
from conveyor.audit import record
from conveyor.web.params import FILTER_NAMES
from conveyor.web.security import Access

#: The audit's name of each outcome; an outcome not named here changed nothing.
ACTIONS = {
    "retried": "retry",
    "signal_woke": "signal",
    "signal_kept": "signal",
    "cancelled": "cancel",
    "cancel_requested": "cancel",
    "run_now": "run now",
    "held": "hold",
    "unheld": "unhold",
    "deleted": "delete",
    "taken_back": "take back",
    "taken_back_failed": "take back",
    "paused": "pause",
    "resumed": "resume",
    "retried_all": "retry failed",
    "purged": "purge",
    "queue_deleted": "delete queue",
    "bulk_retry": "retry",
    "bulk_cancel": "cancel",
    "bulk_delete": "delete",
    "bulk_run_now": "run now",
    "bulk_take_back": "take back",
    "limit_set": "limit set",
    "limit_cleared": "limit clear",
    "throttle_lifted": "throttle lift",
    "fair_set": "fair",
    "fair_off": "fair off",
    "workflow_cancelled": "cancel workflow",
    "worker_quiet": "worker quiet",
    "worker_resume": "worker resume",
    "worker_stop": "worker stop",
    "worker_concurrency": "worker concurrency",
}
#: The longest list of ticked ids an entry names (it counts them all).
IDS_SHOWN = 20


def audit_action(
    app: App,
    access: Access,
    code: str,
    count: str,
    path_params: dict[str, object],
    form: dict[str, list[str]],
) -> None:
    """Record a dashboard action that answered ``code`` (and ``count`` jobs, if it counts)."""
    action = ACTIONS.get(code)
    if action is None:
        return
    jobs = int(count) if count.isdigit() else None
    target = describe(code, path_params, form)
    if "job_id" in path_params and jobs is None:
        jobs = 1
    record(app, access.who, "dashboard", action, target, jobs)


def describe(code: str, path_params: dict[str, object], form: dict[str, list[str]]) -> str:
    """What the action acted on, in words a reader of the audit follows."""
    if "job_id" in path_params:
        return f"job {path_params['job_id']}"
    if "workflow_id" in path_params:
        return f"workflow {path_params['workflow_id']}"
    if "queue" in path_params:
        return f"queue {path_params['queue']}" + _limit_details(code, form)
    if code == "purged":
        return "finished jobs " + _form_query(form, ("older_than", "state", "queue"))
    if code.startswith("worker_"):
        slots = f" to {_first(form, 'slots')}" if code == "worker_concurrency" else ""
        return f"worker {_first(form, 'worker')}{slots}"
    if "worker" in form:
        return f"running jobs of worker {_first(form, 'worker')}"
    ids = form.get("id")
    if ids:
        shown = ", ".join(ids[:IDS_SHOWN]) + (", …" if len(ids) > IDS_SHOWN else "")
        return f"jobs {shown}"
    return "jobs matching " + _form_query(form, FILTER_NAMES)


def _limit_details(code: str, form: dict[str, list[str]]) -> str:
    if code == "limit_set":
        given = [
            f"{name} {_first(form, name)}"
            for name in ("rate", "concurrency")
            if _first(form, name).strip()
        ]
        scope = " per key" if _first(form, "scope") == "key" else ""
        return f": {', '.join(given)}{scope}"
    if code == "limit_cleared":
        return " per key" if _first(form, "scope") == "key" else ""
    if code == "throttle_lifted" and _first(form, "limit_key").strip():
        return f" key {_first(form, 'limit_key').strip()}"
    return ""


def _form_query(form: dict[str, list[str]], names: tuple[str, ...]) -> str:
    pairs = [(name, value) for name in names for value in form.get(name, []) if value]
    return urlencode(pairs) or "(all)"


def _first(form: dict[str, list[str]], name: str) -> str:
    values = form.get(name) or [""]
    return values[0]
