"""Charts as inline SVG, laid out here so pages need no script: throughput over the
last hour (the overview), and per task bars and percentile lines over any number
of slots (the tasks page)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    """Stacked bars, one per minute of the window, scaled to the busiest minute."""
    titles = [f"{(start + SLOT * i).strftime('%H:%M')} UTC" for i in range(SLOTS)]
    in_order = {state: series[state] for state in STATES}
    return _stack(in_order, titles, width, height, gap, count_format="")


# --- per-task metrics: any number of slots ----------------------------------------------


def stacked_bars(
    series: dict[str, list[int]], titles: Sequence[str], width: int, height: int
) -> Chart:
    """Stacked bars, one per slot (``titles`` name the slots), bottom up in the
    order of ``series``, scaled to the busiest slot."""
    # No gap between bars too thin to spare a pixel.
    gap = 1.0 if width / max(len(titles), 1) > 4 else 0.0
    return _stack(series, titles, width, height, gap, count_format=",")


def _stack(
    series: dict[str, list[int]],
    titles: Sequence[str],
    width: int,
    height: int,
    gap: float,
    count_format: str,
) -> Chart:
    """The bars of both charts: one per slot, bottom up in the order of ``series``;
    ``count_format`` writes a count in a bar's title."""
    slots = len(titles)
    totals = [sum(values[i] for values in series.values()) for i in range(slots)]
    chart = Chart(width=width, height=height, peak=max(totals, default=0), total=sum(totals))
    if chart.peak == 0:
        return chart
    step = width / slots
    for i in range(slots):
        base = float(height)
        for name, values in series.items():
            if values[i] == 0:
                continue
            # At least one pixel, so a single failure in a busy hour still shows.
            h = max(1.0, height * values[i] / chart.peak)
            base -= h
            chart.bars.append(
                Bar(
                    x=round(i * step, 2),
                    y=round(base, 2),
                    width=round(max(step - gap, 0.5), 2),
                    height=round(h, 2),
                    state=name,
                    title=f"{titles[i]}: {values[i]:{count_format}} {name}",
                )
            )
    return chart


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    #: SVG polyline points, one run of slots with a value each ("x,y x,y ...").
    runs: list[str]
    #: One dot per slot with a value: x, y and its title.
    dots: list[tuple[float, float, str]]


@dataclass(slots=True)
class LineChart:
    width: int
    height: int
    lines: list[Line] = field(default_factory=list)
    #: The values at the top and bottom edges (log scale), None without values.
    top: float | None = None
    bottom: float | None = None


def log_lines(
    lines: dict[str, list[float | None]],
    titles: Sequence[str],
    width: int,
    height: int,
    spell: Callable[[float], str],
) -> LineChart:
    """Lines over the slots on a log scale (percentiles of latencies span orders of
    magnitude: p50 and p99 stay readable on one chart); a slot without a value
    breaks its line."""
    values = [v for vs in lines.values() for v in vs if v is not None and v > 0]
    chart = LineChart(width=width, height=height)
    if not values:
        return chart
    low, high = min(values), max(values)
    if high / low < 10:  # at least a decade, so that noise does not fill the height
        mid = math.sqrt(low * high)
        low, high = mid / math.sqrt(10), mid * math.sqrt(10)
    chart.top, chart.bottom = high, low
    span = math.log(high / low)
    step = width / len(titles)
    pad = 3.0
    for name, vs in lines.items():
        runs: list[str] = []
        dots: list[tuple[float, float, str]] = []
        current: list[str] = []
        for i, v in enumerate(vs):
            if v is None or v <= 0:
                if current:
                    runs.append(" ".join(current))
                current = []
                continue
            x = round((i + 0.5) * step, 2)
            y = round(pad + (height - 2 * pad) * (1 - math.log(v / low) / span), 2)
            current.append(f"{x},{y}")
            dots.append((x, y, f"{titles[i]}: {name} {spell(v)}"))
        if current:
            runs.append(" ".join(current))
        chart.lines.append(Line(name=name, runs=runs, dots=dots))
    return chart
