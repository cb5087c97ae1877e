"""``conveyor metrics``: /metrics alone, for Prometheus, without the dashboard.

The scrape is the dashboard's (``web/metrics.py``): every value is read from the
store, so this process, any dashboard and any other exporter on the same store
give the same counters. It serves nothing but ``/metrics`` and ``/healthz``: no
job's arguments, results or errors, and no action, so it needs no token.
"""

from __future__ import annotations

import threading

import click
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from conveyor.app import App
from conveyor.cli.options import dsn_option
from conveyor.errors import ConveyorError, SchemaMissingError
from conveyor.store.dsn import default_dsn, require_existing
from conveyor.web.metrics import Metrics, metrics_down, metrics_response
from conveyor.web.outage import unreachable

#: The port OpenTelemetry's Prometheus exporter also takes by default.
DEFAULT_PORT = 9464


def create_metrics_app(app: App) -> Starlette:
    """An ASGI application serving ``app``'s /metrics and /healthz, nothing else."""
    metrics = Metrics(app)
    lock = threading.Lock()  # one scrape at a time folds and reads

    def scrape(request: Request) -> Response:
        try:
            with lock:
                text = metrics.render()
        except SchemaMissingError as exc:
            return PlainTextResponse(f"# {exc}\n", status_code=503)
        except Exception as exc:
            if not unreachable(exc):
                raise
            return metrics_response(metrics_down())
        return metrics_response(text)

    def healthz(request: Request) -> Response:
        try:
            app.ping()
        except Exception as exc:
            if not unreachable(exc):
                raise
            return PlainTextResponse("store unreachable\n", status_code=503)
        return PlainTextResponse("ok\n")

    return Starlette(routes=[Route("/metrics", scrape), Route("/healthz", healthz)])


@click.command("metrics")
@dsn_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
def metrics(dsn: str | None, host: str, port: int) -> None:
    """Serve /metrics (and /healthz) for Prometheus, without the dashboard."""
    import uvicorn

    if dsn is None:
        dsn = default_dsn()
    try:
        require_existing(dsn)
        app = App(dsn)
        app.check_schema()
    except ConveyorError as exc:
        raise click.ClickException(str(exc)) from None
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"conveyor metrics on http://{shown}:{port}/metrics ({app.description})")
    try:
        uvicorn.run(
            create_metrics_app(app), host=host, port=port, log_level="warning", server_header=False
        )
    finally:
        app.close()
