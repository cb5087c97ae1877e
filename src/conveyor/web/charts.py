"""Throughput over the last hour as inline SVG, laid out here so pages need no script."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from conveyor.store.records import FinishedCount

#: The window and its slots: one bar per minute of the last hour.
WINDOW = timedelta(hours=1)
SLOT = timedelta(minutes=1)
SLOTS = int(WINDOW / SLOT)
#: Stacking order, bottom up.
STATES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    state: str
    title: str


@dataclass(slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar] = field(default_factory=list)
    peak: int = 0
    total: int = 0


def per_slot(rows: Sequence[FinishedCount], queue: str | None) -> dict[str, list[int]]:
    """Counts per state and slot (oldest first), of one queue or of all."""
    series = {state: [0] * SLOTS for state in STATES}
    for row in rows:
        if (queue is None or row.queue == queue) and row.state in series and 0 <= row.slot < SLOTS:
            series[row.state][row.slot] += row.count
    return series


def bar_chart(
    series: dict[str, list[int]], start: datetime, width: int, height: int, gap: float = 1.0
) -> Chart:
    """Stacked bars, one per slot, scaled to the busiest slot."""
    totals = [sum(series[state][i] for state in STATES) for i in range(SLOTS)]
    chart = Chart(width=width, height=height, peak=max(totals), total=sum(totals))
    if chart.peak == 0:
        return chart
    step = width / SLOTS
    for i in range(SLOTS):
        base = float(height)
        minute = (start + SLOT * i).strftime("%H:%M")
        for state in STATES:
            count = series[state][i]
            if count == 0:
                continue
            # At least one pixel, so a single failure in a busy hour still shows.
            h = max(1.0, height * count / chart.peak)
            base -= h
            chart.bars.append(
                Bar(
                    x=round(i * step, 2),
                    y=round(base, 2),
                    width=round(max(step - gap, 0.5), 2),
                    height=round(h, 2),
                    state=state,
                    title=f"{minute} UTC: {count} {state}",
                )
            )
    return chart
