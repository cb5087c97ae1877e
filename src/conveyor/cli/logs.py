"""How a conveyor process writes its log: plain text for people, JSON lines for collectors.

conveyor logs through the standard ``logging`` module only (loggers
``conveyor.worker``, ``conveyor.maintenance``, ...), so an application routes
and formats its lines as it does its own. ``configure_logging`` is what
``conveyor worker --log-level --log-format`` does; an application that
configures logging itself need not call it, and can use ``JsonFormatter`` alone.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


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
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(
    level: str = "INFO", log_format: str = "text", stream: TextIO | None = None
) -> None:
    """Send log records of ``level`` and above to ``stream`` (stderr), as text or JSON lines.

    Replaces the handlers of the root logger, as ``logging.basicConfig(force=True)`` does.
    """
    name = level.upper()
    if name not in LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: use text or json")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=name, handlers=[handler], force=True)
