"""A workflow's graph laid out for the dashboard: columns by depth, one box per job.

A job's column is one more than its deepest parent's (parents outside the
workflow do not count), so every edge runs left to right; within a column jobs
are in id order. Drawn as SVG by templates/_workflow_live.html, each box in
its state's colour (the stylesheet's, so dark mode follows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from conveyor.job import Job
from conveyor.workflow import label_of_job

BOX_W = 150
BOX_H = 34
GAP_X = 56
GAP_Y = 12
PAD = 8
#: Characters of a box's label (12 px monospace in BOX_W less its padding).
LABEL_CHARS = 18
#: Larger graphs are listed, not drawn: a picture of thousands of boxes says nothing.
MAX_DRAWN = 400


@dataclass(frozen=True, slots=True)
class Box:
    job: Job
    state: str
    x: int
    y: int
    label: str
    #: The node's whole label (None: none), for the box's tooltip.
    full_label: str | None = None


@dataclass(frozen=True, slots=True)
class Line:
    d: str
    state: str


@dataclass(frozen=True, slots=True)
class Layout:
    boxes: list[Box]
    lines: list[Line]
    width: int
    height: int


def layout(
    jobs: Sequence[Job], edges: Sequence[tuple[int, int, str | None]], now: datetime
) -> Layout:
    """Boxes and edge paths of the jobs of one workflow (``edges``: child, parent, resolved)."""
    ids = {job.id for job in jobs}
    parents: dict[int, list[int]] = {}
    for child, parent, _ in edges:
        if child in ids and parent in ids:
            parents.setdefault(child, []).append(parent)
    depth: dict[int, int] = {}
    for job in sorted(jobs, key=lambda j: j.id):  # parents have lower ids: enqueued first
        depth[job.id] = 1 + max((depth.get(p, 0) for p in parents.get(job.id, [])), default=-1)
    columns: dict[int, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: j.id):
        columns.setdefault(depth[job.id], []).append(job)
    place: dict[int, tuple[int, int]] = {}
    boxes = []
    for column, members in sorted(columns.items()):
        for row, job in enumerate(members):
            x = PAD + column * (BOX_W + GAP_X)
            y = PAD + row * (BOX_H + GAP_Y)
            place[job.id] = (x, y)
            boxes.append(Box(job, job.detailed_state(now), x, y, label_of(job), label_of_job(job)))
    lines = []
    for child, parent, resolved in edges:
        if child not in place or parent not in place:
            continue
        (px, py), (cx, cy) = place[parent], place[child]
        x1, y1 = px + BOX_W, py + BOX_H // 2
        x2, y2 = cx, cy + BOX_H // 2
        bend = (x2 - x1) // 2
        d = f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
        lines.append(Line(d, resolved or "waiting"))
    width = PAD * 2 + (max(columns, default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    tallest = max((len(m) for m in columns.values()), default=1)
    height = PAD * 2 + tallest * (BOX_H + GAP_Y) - GAP_Y
    return Layout(boxes, lines, width, height)


def label_of(job: Job) -> str:
    """ "label #id", or "task #id" for a node without a label (``wf.add(label=...)``),
    cut to fit the box (the id is always whole)."""
    tail = f" #{job.id}"
    room = max(LABEL_CHARS - len(tail), 4)
    name = label_of_job(job) or job.task
    name = name if len(name) <= room else name[: room - 1] + "…"
    return name + tail
