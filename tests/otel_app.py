"""A traced App for ``conveyor worker`` in a subprocess: its spans go to a file, one per line.

The worker process has an OpenTelemetry SDK of its own; each span it ends is
written as JSON to the file named by ``SPANS_FILE`` (a span exporter the test
reads afterwards), so the test can follow one trace across the two processes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from conveyor import App
from conveyor.otel import ConveyorInstrumentor


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["SPANS_FILE"])))
ConveyorInstrumentor().instrument(tracer_provider=provider)
tracer = provider.get_tracer("otel_app")

app = App(os.environ["CONVEYOR_DSN"])


@app.task(queue="traced")
def send_email(to: str) -> str:
    with tracer.start_as_current_span("smtp"):  # the handler's own span, under the attempt
        return f"sent to {to}"


@app.task(queue="traced", max_attempts=1)
def bounce() -> None:
    raise ConnectionError("mailbox full")
