"""The log options of ``conveyor worker``: ``--log-level`` and ``--log-format text|json``.

The formatting itself is ``conveyor.logs`` (usable without the command line).
"""

from __future__ import annotations

from typing import TextIO

from conveyor.logs import LEVELS, TEXT_FORMAT, JsonFormatter, configure

__all__ = ["FORMATS", "LEVELS", "TEXT_FORMAT", "JsonFormatter", "configure_logging"]

FORMATS = ("text", "json")


def configure_logging(
    level: str = "INFO", log_format: str = "text", stream: TextIO | None = None
) -> None:
    """What ``--log-level`` and ``--log-format`` do: ``conveyor.logs.configure``."""
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: use text or json")
    configure(level, json=log_format == "json", stream=stream)
