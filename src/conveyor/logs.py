"""How conveyor's log reads: plain text for people, or one JSON object per line for collectors.

conveyor logs through the standard ``logging`` module only (loggers
``conveyor.worker``, ``conveyor.consume``, ``conveyor.maintenance``,
``conveyor.middleware``, ...), so an application routes and formats its lines
as it does its own. Every record about a job carries the job's ``job_id``,
``task``, ``queue`` and ``attempt`` as fields of the record (``extra=``):
``JsonFormatter`` writes them as keys of the object, so that a log pipeline
can index them.

``configure(json=True)`` is what ``conveyor worker --log-format json`` does;
an application that configures logging itself needs only ``JsonFormatter``::

    handler = logging.StreamHandler()
    handler.setFormatter(conveyor.logs.JsonFormatter())
    logging.getLogger("conveyor").addHandler(handler)
"""

from __future__ import annotations

import json as _json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from conveyor.job import Job

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


def job_fields(job: Job) -> dict[str, Any]:
    """The fields of every log record about a job: ``log.warning(..., extra=job_fields(job))``.

    Besides the job's id, task, queue and attempt: the ``worker`` that holds it
    (when one does) and the ``trace_id`` of the trace it was enqueued in (from
    its ``traceparent`` header, when OpenTelemetry put one there), so that a
    log pipeline joins a job's lines to its worker and to its trace.
    """
    fields: dict[str, Any] = {
        "job_id": job.id,
        "task": job.task,
        "queue": job.queue,
        "attempt": job.attempts,
    }
    if job.worker:
        fields["worker"] = job.worker
    trace_id = _trace_id(job.headers)
    if trace_id is not None:
        fields["trace_id"] = trace_id
    return fields


def _trace_id(headers: dict[str, str] | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (version-traceid-spanid-flags), if well formed."""
    parent = (headers or {}).get("traceparent")
    parts = parent.split("-") if isinstance(parent, str) else []
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1]


def error_fields(error: str | None) -> dict[str, str]:
    """``error.type`` and ``error.message`` of a stored error (a traceback's last line:
    ``ValueError: card declined``), for a log record's fields; nothing if there is none."""
    lines = [line.strip() for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return {}
    kind, colon, message = lines[-1].partition(":")
    if colon and kind and all(part.isidentifier() for part in kind.split(".")):
        return {"error.type": kind, "error.message": message.strip()}
    return {"error.message": lines[-1]}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's extra fields.

    ``log.info("job done", extra={"job_id": 7})`` gives
    ``{"time": "2026-11-22T10:04:05.123456+00:00", "level": "INFO",
    "logger": "conveyor.worker", "message": "job done", "job_id": 7}``. An
    exception's traceback goes in ``exception``; a value JSON cannot hold is
    written as its ``str()``.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in entry:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
            exc = record.exc_info[1]
            if exc is not None:
                entry.setdefault("error.type", type(exc).__qualname__)
                entry.setdefault("error.message", str(exc))
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return _json.dumps(entry, default=str, ensure_ascii=False)


def spelled_duration(seconds: float) -> str:
    """A span of time as people read it: ``2.1 s``, ``42 s``, ``3 min 5 s``, ``3 d 4 h``.

    The one way durations are written: in the worker's log, by the command line
    and on the dashboard. Two units at most; a part that is zero is left out
    (``10 min``, not ``10 min 0 s``); a negative span is written as none.
    """
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def configure(level: str = "INFO", *, json: bool = False, stream: TextIO | None = None) -> None:
    """Send log records of ``level`` and above to ``stream`` (stderr), as text or JSON lines.

    Replaces the handlers of the root logger, as ``logging.basicConfig(force=True)`` does.
    """
    name = level.upper() if isinstance(level, str) else level
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=name, handlers=[handler], force=True)
