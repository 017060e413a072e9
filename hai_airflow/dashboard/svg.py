"""Geometry for the inline SVG charts: quota bars, GPU grids and job time lines (no drawing here)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from hai_airflow.dashboard.formatting import duration, gpu_ranges, job_colour
from hai_airflow.spec import EventView, InstanceView, JobDetailView, NodeView

BAR_WIDTH = 320
CELL = 54
CELL_GAP = 6
CELLS_PER_ROW = 8
TIMELINE_WIDTH = 1200
TIMELINE_PAD = 40
TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_TICKS = 8
SUSPENDED_END_REASONS = frozenset({"preempted", "suspended", "lost"})


@dataclass(frozen=True)
class Bar:
    """Used against limit; `limit` None means no limit, drawn as a hatched full-width bar."""

    used: int
    limit: int | None
    fill: float
    over: bool

    @property
    def text(self) -> str:
        return (
            f"{self.used} / {self.limit} GPUs" if self.limit is not None else f"{self.used} GPUs · no limit"
        )


def quota_bar(used: int, limit: int | None) -> Bar:
    if limit is None:
        return Bar(used, None, 0.0, False)
    share = 1.0 if limit == 0 and used > 0 else (used / limit if limit else 0.0)
    return Bar(used, limit, round(BAR_WIDTH * min(share, 1.0), 1), used > limit)


@dataclass(frozen=True)
class GpuCell:
    index: int
    x: int
    y: int
    job_id: int | None

    @property
    def colour(self) -> str:
        return job_colour(self.job_id) if self.job_id is not None else "#eef0f3"


@dataclass(frozen=True)
class NodeGrid:
    node: NodeView
    cells: tuple[GpuCell, ...]
    width: int
    height: int

    @property
    def free_blocks(self) -> str:
        return gpu_ranges(self.node.free_gpus) or "none"

    @property
    def job_ids(self) -> list[int]:
        return sorted({c.job_id for c in self.cells if c.job_id is not None})


def node_grid(node: NodeView) -> NodeGrid:
    """One cell per GPU, `CELLS_PER_ROW` to a row, each coloured by the job holding it."""
    cells = []
    for i in range(node.gpus):
        row, col = divmod(i, CELLS_PER_ROW)
        cells.append(GpuCell(i, col * (CELL + CELL_GAP), row * (CELL + CELL_GAP), node.holders.get(i)))
    per_row = min(max(node.gpus, 1), CELLS_PER_ROW)
    rows = max(1, -(-node.gpus // CELLS_PER_ROW))
    return NodeGrid(node, tuple(cells), per_row * (CELL + CELL_GAP), rows * (CELL + CELL_GAP))


@dataclass(frozen=True)
class Segment:
    """A stretch of the job's life: `queued`, `run` (one instance) or `suspended`."""

    kind: str
    x: float
    width: float
    start: datetime
    end: datetime
    instance_id: int | None = None
    end_reason: str | None = None
    preempted_by: int | None = None
    resume: bool = False
    note: str = ""

    @property
    def title(self) -> str:
        length = duration((self.end - self.start).total_seconds())
        return f"{self.kind} {length}" + (f": {self.note}" if self.note else "")


@dataclass(frozen=True)
class Mark:
    kind: str
    x: float
    at: datetime
    title: str


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    t0: datetime
    t1: datetime
    segments: tuple[Segment, ...]
    marks: tuple[Mark, ...]
    ticks: tuple[Tick, ...]
    width: int = TIMELINE_WIDTH


def _tick_step(span: float) -> int:
    return next((s for s in TICK_STEPS if span / s <= MAX_TICKS), TICK_STEPS[-1])


def _tick_label(seconds: int) -> str:
    if seconds == 0:
        return "0"
    return f"+{duration(seconds)}".replace(" 00s", "").replace(" 00m", "")


class XScale:
    """Maps a time to an x coordinate between the paddings."""

    def __init__(self, t0: datetime, t1: datetime, width: int):
        self.t0 = t0
        self.span = max((t1 - t0).total_seconds(), 1.0)
        self.inner = width - 2 * TIMELINE_PAD

    def __call__(self, at: datetime) -> float:
        return round(TIMELINE_PAD + self.inner * (at - self.t0).total_seconds() / self.span, 1)

    def width(self, start: datetime, end: datetime) -> float:
        return max(round(self(end) - self(start), 1), 1.0)


def _gap(prev: InstanceView | None, start: datetime, end: datetime, x: XScale) -> Segment:
    if prev is not None and prev.end_reason in SUSPENDED_END_REASONS:
        by = prev.preempted_by
        note = f"preempted by job {by}" if by else f"{prev.end_reason} (instance {prev.id})"
        return Segment("suspended", x(start), x.width(start, end), start, end, preempted_by=by, note=note)
    return Segment("queued", x(start), x.width(start, end), start, end, note="waiting for GPUs")


def job_timeline(
    job: JobDetailView, instances: list[InstanceView], now: datetime, width: int = TIMELINE_WIDTH
) -> Timeline:
    """Queued, run and suspended stretches from submission to the end (or now), plus checkpoint marks."""
    t0 = job.submitted_at
    t1 = max(job.ended_at or now, t0)
    x = XScale(t0, t1, width)
    segments: list[Segment] = []
    cursor, prev = t0, None
    for inst in sorted(instances, key=lambda i: i.id):
        if inst.started_at is None:
            continue
        if inst.started_at > cursor:
            segments.append(_gap(prev, cursor, inst.started_at, x))
        end = inst.ended_at or t1
        note = f"instance {inst.id}" + (
            f", resumed from {inst.checkpoint}" if inst.resume and inst.checkpoint else ""
        )
        note += f", ended: {inst.end_reason}" if inst.end_reason else ""
        segments.append(
            Segment(
                "run",
                x(inst.started_at),
                x.width(inst.started_at, end),
                inst.started_at,
                end,
                instance_id=inst.id,
                end_reason=inst.end_reason,
                preempted_by=inst.preempted_by,
                resume=inst.resume,
                note=note,
            )
        )
        cursor, prev = end, inst
    if cursor < t1 and job.ended_at is None:
        segments.append(_gap(prev, cursor, t1, x))
    marks = tuple(_mark(e, x) for e in job.events if e.kind in ("checkpoint", "suspending", "promoted"))
    span = int(x.span)
    step = _tick_step(span)
    ticks = tuple(
        Tick(round(TIMELINE_PAD + x.inner * s / x.span, 1), _tick_label(s)) for s in range(0, span + 1, step)
    )
    return Timeline(t0, t1, tuple(segments), marks, ticks, width)


def _mark(event: EventView, x: XScale) -> Mark:
    return Mark(event.kind, x(event.at), event.at, event.reason)
