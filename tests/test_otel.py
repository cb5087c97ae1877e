"""OpenTelemetry: a PRODUCER span per enqueue, a CONSUMER span per attempt, one trace.

In this process with the SDK's InMemorySpanExporter (on every store), and
across processes: the test enqueues inside a span of its own, a ``conveyor
worker`` subprocess with an SDK of its own writes its spans to a file, and the
attempt's span must be in the test's trace, a child of the enqueue's span.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import App, middleware
from conveyor.otel import ConveyorInstrumentor
from conveyor.store.dsn import DSN_ENV
from conveyor.store.postgres import listener as pg_listener

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _prompt_listener_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_listener, "_WAIT", 0.05)


@pytest.fixture
def traced() -> Iterator[tuple[InMemorySpanExporter, trace.Tracer]]:
    """Spans of this process, kept in memory; conveyor instrumented meanwhile."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = ConveyorInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter, provider.get_tracer("test")
    finally:
        instrumentor.uninstrument()
    assert middleware.installed() == ()


def named(spans: Any, name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span  # type: ignore[no-any-return]


def test_a_job_is_traced_under_the_span_that_enqueued_it(
    app: App, traced: tuple[InMemorySpanExporter, trace.Tracer]
) -> None:
    exporter, tracer = traced

    @app.task(queue="mail")
    def send_email(to: str) -> str:
        with tracer.start_as_current_span("smtp"):
            return f"sent to {to}"

    @app.task(queue="mail", max_attempts=1)
    def bounce() -> None:
        raise ConnectionError("mailbox full")

    with tracer.start_as_current_span("POST /signup") as request:
        job = send_email.enqueue("ada@example.com")
        bounced = bounce.enqueue()
    assert job.headers["traceparent"].split("-")[1] == f"{request.get_span_context().trace_id:032x}"
    with app.worker(queues=["mail"], burst=True, maintenance=False) as worker:
        assert worker.wait_stopped(30)
    spans = exporter.get_finished_spans()
    request_span = named(spans, "POST /signup")
    publish = named(spans, "send_email publish")
    process = named(spans, "send_email process")
    trace_id = request_span.context.trace_id
    assert publish.kind == SpanKind.PRODUCER and process.kind == SpanKind.CONSUMER
    assert publish.parent is not None and publish.parent.span_id == request_span.context.span_id
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert {s.context.trace_id for s in spans} == {trace_id}  # one trace, enqueue to handler
    assert named(spans, "smtp").parent.span_id == process.context.span_id  # type: ignore[union-attr]
    assert dict(publish.attributes or {}) == {
        "messaging.system": "conveyor",
        "messaging.operation": "publish",
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.batch.message_count": 1,
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job.id),
        "conveyor.task": "send_email",
    }
    assert dict(process.attributes or {}) == {
        "messaging.system": "conveyor",
        "messaging.operation": "process",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job.id),
        "conveyor.task": "send_email",
        "conveyor.attempt": 1,
        "conveyor.outcome": "succeeded",
    }
    assert process.status.status_code == StatusCode.UNSET
    failed = named(spans, "bounce process")
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "ConnectionError: mailbox full"
    assert dict(failed.attributes or {})["conveyor.outcome"] == "failed"
    (event,) = failed.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "ConnectionError"
    assert dict(event.attributes or {})["exception.message"] == "mailbox full"
    assert app.get(bounced.id).error is not None


def test_consume_traces_the_attempt_from_hand_out_to_end(
    app: App, traced: tuple[InMemorySpanExporter, trace.Tracer]
) -> None:
    exporter, tracer = traced
    job_id = app.enqueue("resize", queue="images").id
    for job in app.consume(["images"], idle_timeout=5):
        with tracer.start_as_current_span("work"):
            job.fail(ValueError("bad image"), retry_in=3600)
        break
    spans = exporter.get_finished_spans()
    publish, process = named(spans, "resize publish"), named(spans, "resize process")
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert named(spans, "work").parent.span_id == process.context.span_id  # type: ignore[union-attr]
    assert dict(process.attributes or {})["messaging.message.id"] == str(job_id)
    assert dict(process.attributes or {})["conveyor.outcome"] == "retried"
    assert process.status.status_code == StatusCode.ERROR


def test_a_failed_enqueue_ends_its_span_in_error(
    sqlite_path: Path, traced: tuple[InMemorySpanExporter, trace.Tracer]
) -> None:
    exporter, _ = traced
    with App(f"sqlite:///{sqlite_path}") as app:
        app.migrate()
        closed = sqlite3.connect(sqlite_path)
        closed.close()
        with pytest.raises(sqlite3.ProgrammingError):
            app.enqueue("t", connection=closed)
    span = named(exporter.get_finished_spans(), "t publish")
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_uninstrument_stops_the_tracing(sqlite_path: Path) -> None:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = ConveyorInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    instrumentor.uninstrument()
    with App(f"sqlite:///{sqlite_path}") as app:
        app.migrate()
        assert app.enqueue("t").headers == {}
    assert exporter.get_finished_spans() == ()


# --- across processes -------------------------------------------------------------------------


def test_the_trace_goes_on_in_a_worker_process(
    dsn: str, tmp_path: Path, traced: tuple[InMemorySpanExporter, trace.Tracer]
) -> None:
    exporter, tracer = traced
    with App(dsn) as app:
        app.migrate()
        with tracer.start_as_current_span("POST /signup"):
            sent = app.enqueue("send_email", ["ada@example.com"], queue="traced")
            bounced = app.enqueue("bounce", queue="traced")
    spans_file = tmp_path / "worker-spans.jsonl"
    worker = subprocess.run(
        [sys.executable, "-m", "conveyor", "worker", "otel_app:app", "--burst"],
        cwd=TESTS,
        env={**os.environ, DSN_ENV: dsn, "SPANS_FILE": str(spans_file)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr
    ours = exporter.get_finished_spans()
    request = named(ours, "POST /signup")
    theirs = [json.loads(line) for line in spans_file.read_text().splitlines()]
    by_name = {span["name"]: span for span in theirs}
    assert sorted(by_name) == ["bounce process", "send_email process", "smtp"]
    trace_id = f"0x{request.context.trace_id:032x}"
    for name, job, publish in [
        ("send_email process", sent, named(ours, "send_email publish")),
        ("bounce process", bounced, named(ours, "bounce publish")),
    ]:
        process = by_name[name]
        assert process["kind"] == "SpanKind.CONSUMER"
        assert process["context"]["trace_id"] == trace_id  # the request's trace
        assert process["parent_id"] == f"0x{publish.context.span_id:016x}"  # the enqueue's span
        assert process["attributes"]["messaging.message.id"] == str(job.id)
    smtp = by_name["smtp"]
    assert smtp["parent_id"] == by_name["send_email process"]["context"]["span_id"]
    assert by_name["bounce process"]["status"]["status_code"] == "ERROR"
    assert by_name["bounce process"]["events"][0]["attributes"]["exception.type"] == (
        "ConnectionError"
    )
