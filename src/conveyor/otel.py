"""OpenTelemetry tracing of conveyor: a span per enqueue and per attempt, one trace throughout.

Install the extra (``pip install conveyor[otel]``), set up the OpenTelemetry
SDK as for any instrumentation, then::

    from conveyor.otel import ConveyorInstrumentor

    ConveyorInstrumentor().instrument()    # every App of the process, from now on

Each enqueue call makes a PRODUCER span ``<task> publish`` and writes the W3C
trace context (``traceparent``, ``tracestate``, and baggage) into the headers
of its jobs; each attempt makes a CONSUMER span ``<task> process`` whose parent
is that enqueue's span, in the worker's process or wherever ``consume`` runs.
So the trace of a request shows the jobs it enqueued and what became of them.
A failed attempt records its exception and sets the span's status to error.

Attributes follow OpenTelemetry's messaging conventions: ``messaging.system``
("conveyor"), ``messaging.destination.name`` (the queue),
``messaging.operation`` ("publish" or "process"; also as
``messaging.operation.name``, with ``messaging.operation.type`` "send" or
"process"), ``messaging.message.id`` (the job id), with conveyor's own
``conveyor.task``, ``conveyor.attempt`` and ``conveyor.outcome``.

It is a middleware installed globally (``conveyor.middleware.install``), in
OpenTelemetry's instrumentor convention: ``instrument(tracer_provider=...)``
and ``uninstrument()``; ``opentelemetry-instrument`` finds it by its entry point.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

try:
    from opentelemetry import context, propagate, trace
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "conveyor.otel needs OpenTelemetry: pip install 'conveyor[otel]' "
        f"(and the OpenTelemetry SDK to export spans): {exc}"
    ) from exc

from conveyor.job import Job
from conveyor.middleware import Attempt, Enqueue, Middleware, install, uninstall
from conveyor.version import __version__

SYSTEM = "conveyor"


class TracingMiddleware(Middleware):
    """The middleware ConveyorInstrumentor installs: spans around enqueues and attempts."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def before_enqueue(self, enqueue: Enqueue) -> None:
        attributes: dict[str, Any] = {
            **_operation("publish", "send"),
            "messaging.batch.message_count": len(enqueue.jobs),
        }
        if enqueue.queue is not None:
            attributes["messaging.destination.name"] = enqueue.queue
        if enqueue.task is not None:
            attributes["conveyor.task"] = enqueue.task
        span = self.tracer.start_span(
            f"{enqueue.task or SYSTEM} publish", kind=trace.SpanKind.PRODUCER, attributes=attributes
        )
        current = trace.set_span_in_context(span)
        # The job's headers carry this span's context to whoever runs the job.
        propagate.inject(enqueue.headers, context=current)
        # Current while the jobs are inserted: a database client's spans go under it.
        enqueue.state["otel"] = (span, context.attach(current))

    def after_enqueue(
        self, enqueue: Enqueue, jobs: list[Job] | None, error: BaseException | None
    ) -> None:
        span, token = enqueue.state.pop("otel")
        try:
            if jobs is not None and len(jobs) == 1:
                span.set_attribute("messaging.message.id", str(jobs[0].id))
            if error is not None:
                span.record_exception(error)
                span.set_status(trace.Status(trace.StatusCode.ERROR, _first_line(str(error))))
            span.end()
        finally:
            context.detach(token)

    def before_attempt(self, attempt: Attempt) -> None:
        job = attempt.job
        parent = propagate.extract(job.headers)
        span = self.tracer.start_span(
            f"{job.task} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={
                **_operation("process", "process"),
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "conveyor.task": job.task,
                "conveyor.attempt": job.attempts,
            },
        )
        # Current in the handler: its own spans (HTTP calls, queries) go under the attempt.
        attempt.state["otel"] = (span, context.attach(trace.set_span_in_context(span)))

    def after_attempt(self, attempt: Attempt) -> None:
        span, token = attempt.state.pop("otel")
        try:
            span.set_attribute("conveyor.outcome", attempt.outcome or "")
            if attempt.failed:
                if attempt.exception is not None:
                    span.record_exception(attempt.exception)
                description = _last_line(attempt.error) if attempt.error else attempt.outcome
                span.set_status(trace.Status(trace.StatusCode.ERROR, description))
            span.end()
        finally:
            context.detach(token)


class ConveyorInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Traces conveyor's enqueues and attempts (see the module's documentation).

    ``ConveyorInstrumentor().instrument(tracer_provider=provider)``: the
    provider is the global one when not given. ``uninstrument()`` stops it.
    """

    _middleware: TracingMiddleware | None = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # conveyor instruments itself: nothing else must be installed

    def _instrument(self, **kwargs: Any) -> None:
        tracer = trace.get_tracer(
            __name__, __version__, tracer_provider=kwargs.get("tracer_provider")
        )
        self._middleware = TracingMiddleware(tracer)
        install(self._middleware)

    def _uninstrument(self, **kwargs: Any) -> None:
        if self._middleware is not None:
            uninstall(self._middleware)
            self._middleware = None


def _operation(name: str, kind: str) -> dict[str, str]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation": name,
        "messaging.operation.name": name,
        "messaging.operation.type": kind,
    }


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


def _last_line(text: str) -> str:
    """The last line of a traceback: the exception and its message."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
