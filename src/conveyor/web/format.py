"""How the pages write values: durations, times with their zone, JSON, first lines of errors.

Each is a Jinja2 filter. They take whatever a row holds, odd values included
(a blank error, a progress that is not a number, text that is not JSON), and
never raise: a page must not fail on data a worker stored.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any
from urllib.parse import quote

from conveyor.encryption import SEALED_LABEL
from conveyor.job import is_sealed
from conveyor.logs import spelled_duration


def segment(value: str) -> str:
    """A name quoted to stand as one path segment (queue names may hold a slash)."""
    return quote(value, safe="")


def seconds(value: float | None) -> str:
    """A duration as the worker's log and the command line write it: 42 s, 3 min 5 s."""
    if value is None or not math.isfinite(value):
        return "—"
    return spelled_duration(value)


def thousands(value: object) -> str:
    """A count with its thousands separated: 20,000 (anything else as it is)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def ago(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "—"
    delta = (now - value).total_seconds()
    return f"{seconds(delta)} ago" if delta >= 0 else f"in {seconds(-delta)}"


def when(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: datetime | None) -> str:
    return "" if value is None else value.isoformat()


def pretty_json(text: str | None) -> str:
    if text is None:
        return "—"
    if is_sealed(text):
        return SEALED_LABEL  # never ciphertext shown as if it were the value
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=True)
    except (ValueError, RecursionError):
        return text


def stored(text: str | None) -> str:
    """A stored JSON value as text, or that it is encrypted when no key here opens it."""
    if text is None:
        return ""
    return SEALED_LABEL if is_sealed(text) else text


def first_line(text: str | None, limit: int = 120) -> str:
    """The line of an error that says what happened; "" for none (or only blanks)."""
    if not text:
        return ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    # The last line of a traceback names the exception; the first says "Traceback".
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def fraction(value: Any) -> float | None:
    """A progress value fit for <progress>: a finite number clamped to 0..1, else None."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(1.0, max(0.0, float(value)))


def percent(value: Any) -> str:
    shown = fraction(value)
    return "" if shown is None else f"{shown * 100:.0f} %"


FILTERS = {
    "ago": ago,
    "thousands": thousands,
    "when": when,
    "iso": iso,
    "seconds": seconds,
    "pretty_json": pretty_json,
    "stored": stored,
    "first_line": first_line,
    "segment": segment,
    "fraction": fraction,
    "percent": percent,
}
