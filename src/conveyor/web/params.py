"""Reading what a browser sends (query strings, forms) into values the App accepts.

Anything that cannot be right (an id that is not a 64-bit number, a state that
does not exist, a name the databases cannot hold) is a BadRequest: the page
answers 400 saying what is wrong, never a 500 from deeper down.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlencode

from conveyor.errors import InvalidJobError
from conveyor.job import FILTER_STATES, validate_name

#: The filters of a job list, in the order the page shows them.
FILTER_NAMES = (
    "state", "queue", "task", "group", "batch", "worker", "key", "limit_key", "error", "args",
)  # fmt: skip
#: Longest error text searched for (the names' own limit).
MAX_TEXT = 200


class BadRequest(Exception):
    """Something the browser sent cannot be right; the message says what (shown with 400)."""


def parse_id(text: str | None, what: str = "job id") -> int | None:
    """A job id from text: ASCII digits, 1 to 2**63 - 1. None when empty."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    # str.isdigit() accepts "²" and other digits int() refuses: ASCII only.
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**63:
        raise BadRequest(f"{what} must be a whole number from 1 to {2**63 - 1}")
    return int(text)


def job_id_in_range(job_id: int) -> bool:
    """Whether a path's number can be a job id at all (the path accepts any digits)."""
    return 0 < job_id < 2**63


def parse_filters(values: Mapping[str, str]) -> dict[str, str]:
    """The job-list filters given (empty ones left out), each checked."""
    chosen: dict[str, str] = {}
    for name in FILTER_NAMES:
        value = (values.get(name) or "").strip()
        if not value:
            continue
        if name == "state":
            if value not in FILTER_STATES:
                raise BadRequest(f"unknown state {value!r}: one of {', '.join(FILTER_STATES)}")
        elif name in ("error", "args"):
            if len(value) > MAX_TEXT or "\x00" in value:
                what = "error" if name == "error" else "arguments'"
                raise BadRequest(f"the {what} text to look for must be under {MAX_TEXT} characters")
        else:
            try:
                validate_name(name, value)
            except InvalidJobError as exc:
                raise BadRequest(str(exc)) from None
        chosen[name] = value
    return chosen


def query(filters: Mapping[str, object], **extra: object) -> str:
    """A query string of the filters and ``extra``, ``?``-prefixed; "" when all are empty."""
    kept = {k: v for k, v in {**filters, **extra}.items() if v not in (None, "")}
    return "?" + urlencode(kept) if kept else ""
