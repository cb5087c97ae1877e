"""Why a job is not running, on the command line: the block of ``conveyor jobs show``."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from conveyor.diagnosis import Why


def why_dict(why: Why) -> dict[str, Any]:
    """``jobs show --json``'s ``why``: the summary, and each reason with what it names."""
    return {
        "summary": why.summary(),
        "reasons": [
            {
                "kind": reason.kind,
                "text": reason.text,
                "until": reason.until.isoformat() if reason.until is not None else None,
                "limit_key": reason.limit_key,
                "job_ids": list(reason.job_ids),
            }
            for reason in why.reasons
        ],
    }


def why_view(why: Why) -> RenderableType:
    """``why it is not running:`` and a line per reason, wrapped, nothing cut."""
    title = Text("why it is not running:", style="bold dark_orange")
    if not why.reasons:
        return Text.assemble(title, " ", why.summary())
    lines = [title]
    lines.extend(Text("  - " + reason.text) for reason in why.reasons)
    return Text("\n").join(lines)
